"""Provider-safe input schemas: what strict tool modes accept, from the registry's schemas.

The registry's schemas come from pydantic, which writes ``$defs``/``$ref``, ``anyOf``
for ``Optional`` fields and single-item ``allOf`` wrappers. OpenAI's strict function
calling and Anthropic's strict tools accept a subset of JSON Schema, so every run's
catalog passes each schema through :func:`provider_safe` once:

- local ``$ref`` are inlined (a recursive one is refused);
- ``anyOf: [X, {"type": "null"}]`` (an ``Optional`` field) becomes ``X`` with ``"null"``
  added to its ``type``;
- a single-item ``allOf`` is merged into its parent;
- ``oneOf``, ``not``, ``if``/``then``/``else``, ``patternProperties``, ``dependentSchemas``
  and a multi-item ``allOf`` are refused with a :class:`ProviderSchemaError` naming the
  tool and the JSON pointer of the construct;
- with ``strict=True``, every object gets ``additionalProperties: false`` and lists all
  its properties in ``required`` (an optional one becomes nullable), as OpenAI's strict
  mode demands, and keeps only the keywords every provider's strict mode documents
  (:data:`STRICT_KEYWORDS`): annotations (``title``, ``default``, ``examples``) and
  constraints a strict mode may refuse (``maxLength``, ``minimum``, ...) are left out
  of what the model is shown. Nothing is lost: the runner still checks every call's
  arguments against the tool's full registry schema.
"""

from __future__ import annotations

import copy
from typing import Any

from toolfleet.errors import ProviderSchemaError

__all__ = [
    "ANTHROPIC_STRICT_KEYWORDS",
    "OPENAI_STRICT_KEYWORDS",
    "REFUSED_KEYWORDS",
    "STRICT_KEYWORDS",
    "provider_safe",
]

REFUSED_KEYWORDS = ("oneOf", "not", "if", "then", "else", "patternProperties", "dependentSchemas")
"""Keywords no rewrite can express in the strict subset: a schema using one is refused."""

_DROPPED = ("$defs", "definitions", "$schema", "$id")

OPENAI_STRICT_KEYWORDS = frozenset(
    {
        *("type", "properties", "required", "additionalProperties", "items", "enum"),
        *("const", "anyOf", "description", "$ref", "$defs", "pattern", "format"),
        *("multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum"),
        *("minItems", "maxItems"),
    }
)
"""The keywords OpenAI's strict mode (Structured Outputs) documents as supported."""
ANTHROPIC_STRICT_KEYWORDS = frozenset(
    {
        *("type", "properties", "required", "additionalProperties", "items", "enum"),
        *("const", "anyOf", "allOf", "description", "$ref", "$defs", "default"),
        *("format", "minItems"),
    }
)
"""The keywords Anthropic's strict tool use documents as supported (``minItems`` only
0 or 1; no numeric or string-length constraints)."""
STRICT_KEYWORDS = OPENAI_STRICT_KEYWORDS & ANTHROPIC_STRICT_KEYWORDS
"""What a strict schema keeps: the keywords both providers' strict modes support."""
STRICT_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
"""String ``format`` values both strict modes document."""


def provider_safe(tool_id: str, schema: dict[str, Any], *, strict: bool = False) -> dict[str, Any]:
    """A copy of ``schema`` that strict tool modes accept, or a :class:`ProviderSchemaError`."""
    defs = {**schema.get("definitions", {}), **schema.get("$defs", {})}
    rewritten = _Rewrite(tool_id, defs, strict=strict).node(copy.deepcopy(schema), "#", ())
    if rewritten.get("type") != "object":
        raise ProviderSchemaError(tool_id, "#", "the input schema must be an object")
    rewritten.setdefault("properties", {})
    return rewritten


class _Rewrite:
    def __init__(self, tool_id: str, defs: dict[str, Any], *, strict: bool) -> None:
        self.tool_id = tool_id
        self.defs = defs
        self.strict = strict

    def fail(self, path: str, problem: str) -> ProviderSchemaError:
        return ProviderSchemaError(self.tool_id, path, problem)

    def node(self, schema: Any, path: str, seen: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(schema, dict):
            raise self.fail(path, "a schema must be an object")
        fields: dict[str, Any] = dict(schema)
        rewritten = self._node(fields, path, seen)
        return _strict_keywords(rewritten) if self.strict else rewritten

    def _node(self, schema: dict[str, Any], path: str, seen: tuple[str, ...]) -> dict[str, Any]:
        schema = {k: v for k, v in schema.items() if k not in _DROPPED}
        ref = schema.pop("$ref", None)
        if ref is not None:
            schema = self._inline(ref, schema, path, seen)
            seen = (*seen, ref)
        for keyword in REFUSED_KEYWORDS:
            if keyword in schema:
                raise self.fail(f"{path}/{keyword}", f"'{keyword}' is not accepted by strict modes")
        if "allOf" in schema:
            schema = self._merge_all_of(schema, path, seen)
        if "anyOf" in schema:
            return self._any_of(schema, path, seen)
        if isinstance(schema.get("properties"), dict):
            props = schema["properties"]
            schema["properties"] = {
                name: self.node(sub, f"{path}/properties/{_escape(name)}", seen)
                for name, sub in props.items()
            }
        if "items" in schema:
            schema["items"] = self.node(schema["items"], f"{path}/items", seen)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            if self.strict:
                raise self.fail(
                    f"{path}/additionalProperties", "a schema for extra keys is not accepted"
                )
            schema["additionalProperties"] = self.node(extra, f"{path}/additionalProperties", seen)
        if self.strict and schema.get("type") == "object":
            self._strict_object(schema, path)
        return schema

    def _inline(
        self, ref: Any, schema: dict[str, Any], path: str, seen: tuple[str, ...]
    ) -> dict[str, Any]:
        if not isinstance(ref, str) or not ref.startswith(("#/$defs/", "#/definitions/")):
            raise self.fail(f"{path}/$ref", "only local $defs references can be inlined")
        if ref in seen:
            raise self.fail(f"{path}/$ref", "a recursive $ref cannot be inlined")
        target = self.defs.get(ref.rsplit("/", 1)[1])
        if not isinstance(target, dict):
            raise self.fail(f"{path}/$ref", "the $ref names no definition")
        return {**copy.deepcopy(target), **schema}

    def _merge_all_of(
        self, schema: dict[str, Any], path: str, seen: tuple[str, ...]
    ) -> dict[str, Any]:
        parts = schema.pop("allOf")
        if not isinstance(parts, list) or len(parts) != 1:
            raise self.fail(f"{path}/allOf", "'allOf' with several schemas is not accepted")
        inner = self.node(parts[0], f"{path}/allOf/0", seen)
        return {**inner, **schema}

    def _any_of(self, schema: dict[str, Any], path: str, seen: tuple[str, ...]) -> dict[str, Any]:
        options = schema.pop("anyOf")
        if not isinstance(options, list) or not options:
            raise self.fail(f"{path}/anyOf", "'anyOf' must list schemas")
        non_null = [o for o in options if o != {"type": "null"}]
        if len(non_null) == 1 and len(options) == 2:
            # Optional[X]: X, nullable. Annotations on the wrapper (description,
            # default, title) win over the inner schema's.
            inner = self.node(non_null[0], f"{path}/anyOf/{options.index(non_null[0])}", seen)
            merged = {**inner, **schema}
            return _nullable(merged, self.fail(f"{path}/anyOf", "an untyped Optional"))
        schema["anyOf"] = [self.node(o, f"{path}/anyOf/{i}", seen) for i, o in enumerate(options)]
        return schema

    def _strict_object(self, schema: dict[str, Any], path: str) -> None:
        props: dict[str, Any] = schema.setdefault("properties", {})
        required = set(schema.get("required", []))
        for name, sub in props.items():
            if name not in required:
                where = f"{path}/properties/{_escape(name)}"
                props[name] = _nullable(sub, self.fail(where, "an untyped optional property"))
        schema["required"] = list(props)
        schema["additionalProperties"] = False


def _nullable(schema: dict[str, Any], error: ProviderSchemaError) -> dict[str, Any]:
    kind = schema.get("type")
    if isinstance(kind, str):
        schema["type"] = [kind] if kind == "null" else [kind, "null"]
    elif isinstance(kind, list):
        if "null" not in kind:
            schema["type"] = [*kind, "null"]
    elif "enum" in schema:
        if None not in schema["enum"]:
            schema["enum"] = [*schema["enum"], None]
    elif "anyOf" in schema:
        if {"type": "null"} not in schema["anyOf"]:
            schema["anyOf"] = [*schema["anyOf"], {"type": "null"}]
    else:
        raise error
    return schema


def _strict_keywords(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (one node) with only the keywords both strict modes document."""
    kept = {k: v for k, v in schema.items() if k in STRICT_KEYWORDS}
    if kept.get("format") not in STRICT_FORMATS:
        kept.pop("format", None)
    if kept.get("minItems") not in (0, 1):
        kept.pop("minItems", None)
    return kept


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
