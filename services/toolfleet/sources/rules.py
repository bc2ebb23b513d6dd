"""What an operator decides of a source tool: what clients see of its results (allowlist,
result rules) and its effect (pure logic).

Operators set them per tool (``toolfleet sources configure NAME TOOL``, or
``PUT /v1/sources/{name}/tools/{tool}/rules`` and ``.../effect``); they are stored with
the source, copied into every version of the tool (the manifests the validator and
policy read) and into versions listed later. The validator applies the rules as it does
a native tool's ``@tool(...)`` rules. The effect is ``external_side_effect`` until an
operator sets another: what the source says of itself (MCP ``readOnlyHint``, an HTTP
GET) is kept as ``hints`` for the operator to read, never as the effect.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolfleet.contract.result_rules import ResultMode, ResultRules, SanitizeRule
from toolfleet.sources.models import UNVOUCHED_EFFECT, SourceDefinition, SourceTool, ToolEffect
from toolfleet.sources.naming import MCP_PREFIX

#: What clients see of an MCP tool whose allowlist the operator did not set.
DEFAULT_ALLOWLIST = ("content",)


class ToolRules(BaseModel):
    """One source tool's rules as an operator sets them (each write replaces them all)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: list[str] | None = None
    """Result fields clients may see (dotted paths; the rest is ``[REDACTED]``). Unset:
    ``content`` for an MCP tool, the output schema's fields for an HTTP operation."""
    result_validation: ResultMode = ResultMode.STRICT
    """``coerce``: the listed safe coercions first, each reported as a warning."""
    sanitize: dict[str, SanitizeRule] = Field(default_factory=dict)
    """Field path (or ``*``) to action: ``allow``, ``escape``, ``redact``, ``reject``."""
    max_result_bytes: int | None = Field(default=None, ge=1)
    """Largest result (compact JSON) the validator passes: past it, ``result_too_large``."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        """``{"$.body": "escape"}`` means every check with that action."""
        if isinstance(data, dict) and isinstance(data.get("sanitize"), dict):
            rules = {
                k: {"action": v} if isinstance(v, str) else v for k, v in data["sanitize"].items()
            }
            data = {**data, "sanitize": rules}
        return data

    @model_validator(mode="after")
    def _paths_parse(self) -> ToolRules:
        self.result_rules()  # a path outside the supported JSONPath subset: ValueError
        for path in self.allow or []:
            if not all(path.split(".")):
                raise ValueError(f"allow: {path!r} is not a dotted field path")
        return self

    def result_rules(self) -> ResultRules:
        return ResultRules(
            mode=self.result_validation, sanitize=self.sanitize, max_bytes=self.max_result_bytes
        )


class ToolEffectChoice(BaseModel):
    """One source tool's effect as an operator sets it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    effect: ToolEffect | None
    """What running it does; none: back to ``external_side_effect``."""


def with_effect(
    source: SourceDefinition, remote_name: str, effect: ToolEffect | None
) -> SourceDefinition:
    """``source`` with the operator's ``effect`` for its tool ``remote_name``."""
    effects = {k: v for k, v in source.effects.items() if k != remote_name}
    if effect is not None:
        effects[remote_name] = effect
    return source.model_copy(update={"effects": effects})


def effect_of(source: SourceDefinition, tool: SourceTool) -> ToolEffect:
    """The effect an operator vouched for (``effects``, else an HTTP operation's declared
    one), or ``external_side_effect``."""
    if tool.remote_name in source.effects:
        return source.effects[tool.remote_name]
    if tool.source_type == "http":
        for operation in source.operations:
            if operation.operation_id == tool.remote_name and operation.effect is not None:
                return operation.effect
    return UNVOUCHED_EFFECT


def configured(source: SourceDefinition, remote_name: str, rules: ToolRules) -> SourceDefinition:
    """``source`` with ``rules`` for its tool ``remote_name`` (defaults leave no entry)."""
    redaction = {k: v for k, v in source.redaction.items() if k != remote_name}
    if rules.allow is not None:
        redaction[remote_name] = list(rules.allow)
    result_rules = {k: v for k, v in source.result_rules.items() if k != remote_name}
    if rules.result_rules() != ResultRules():
        result_rules[remote_name] = rules.result_rules()
    return source.model_copy(update={"redaction": redaction, "result_rules": result_rules})


def with_rules(source: SourceDefinition, tool: SourceTool) -> SourceTool:
    """``tool`` carrying the allowlist, result rules and effect ``source`` sets for it."""
    if tool.tool_id.startswith(MCP_PREFIX):
        default = list(DEFAULT_ALLOWLIST)
    else:
        default = list(tool.output_schema.get("properties", {}))
    return tool.model_copy(
        update={
            "redaction_allowlist": list(source.redaction.get(tool.remote_name, default)),
            "result_rules": source.result_rules.get(tool.remote_name, ResultRules()),
            "effect": effect_of(source, tool),
        }
    )
