"""Policy as data: per-tenant (and per-agent) documents loaded from YAML or JSON.

Deny by default: a tenant with no entry (and no ``"*"`` entry) may call nothing, and a
tool is allowed only when an ``allow_tools`` pattern names it and no ``deny_tools``
pattern does. Example::

    tenants:
      "*":
        allow_tools: ["core__*"]
      tenant_acme:
        allow_tools: ["core__*", "acme__*"]
        deny_tools: ["acme__drop_database"]
        tool_versions: {"acme__search": "^2.0.0"}
        approval_effects: ["external_side_effect"]
        approval_ttl_s: 3600
        max_concurrent_per_agent: 4
        budgets: {max_runtime_ms: 30000, max_calls_per_minute: 120}
        tool_budgets:
          "acme__*": {max_result_bytes: 1048576}
        agents:
          "did:agent:intern":
            allow_tools: ["core__echo"]
            budgets: {max_calls_per_minute: 10}

Budgets merge field by field, the most specific setting winning: a matching
``tool_budgets`` entry over the agent's ``budgets`` over the tenant's ``budgets``
(see :func:`toolfleet.policy.engine.effective_budgets`).
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.errors import InvalidParameters
from toolfleet.events.models import Effect
from toolfleet.sources.naming import is_untrusted

_GLOB_CHARS = frozenset("*?[")


class Budgets(BaseModel):
    """Resource budgets of a call; ``None`` leaves the setting to a less specific level."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_runtime_ms: int | None = Field(default=None, ge=1)
    """Longest a call may run, in milliseconds."""
    max_result_bytes: int | None = Field(default=None, ge=1)
    """Largest result a call may return, in bytes of JSON."""
    max_calls_per_minute: int | None = Field(default=None, ge=1)
    """Calls allowed per minute (the rate limiter's budget)."""

    def over(self, base: Budgets) -> Budgets:
        """These budgets layered over ``base``: every setting made here wins."""
        return base.model_copy(update=self.model_dump(exclude_none=True))


NO_BUDGETS = Budgets()


class AgentPolicy(BaseModel):
    """What one agent of a tenant may do, narrower than the tenant."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_tools: list[str] | None = None
    """Narrows the tenant's allowlist for this agent (intersection), when set."""
    deny_tools: list[str] = Field(default_factory=list)
    """Glob patterns this agent may not call, on top of the tenant's."""
    budgets: Budgets = NO_BUDGETS
    """Overrides the tenant's budgets for this agent."""


class TenantPolicy(BaseModel):
    """One tenant's policy: what it may call, in which versions, with which budgets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_tools: list[str] = Field(default_factory=list)
    """Glob patterns of tool ids the tenant may call (``core__*``)."""
    deny_tools: list[str] = Field(default_factory=list)
    """Glob patterns that win over ``allow_tools``."""
    tool_versions: dict[str, str] = Field(default_factory=dict)
    """Allowed version range per tool id (or glob)."""
    approval_effects: list[Effect] = Field(default_factory=list)
    """Effects that need a human approval before running."""
    agents: dict[str, AgentPolicy] = Field(default_factory=dict)
    """Per-agent narrowing, by agent DID."""
    budgets: Budgets = NO_BUDGETS
    """The tenant's default budgets."""
    tool_budgets: dict[str, Budgets] = Field(default_factory=dict)
    """Budgets per tool id or glob; they win over agent and tenant budgets."""
    max_concurrent_per_agent: int = Field(default=4, ge=1)
    """Calls one agent may have running at once."""
    approval_ttl_s: int | None = Field(default=None, ge=1)
    """How long a call waits for approval; ``None`` keeps the service's default."""


class PolicyDocument(BaseModel):
    """A whole policy file: tenants by id, ``"*"`` for every tenant not listed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenants: dict[str, TenantPolicy] = Field(default_factory=dict)

    def for_tenant(self, tenant_id: str) -> TenantPolicy | None:
        return self.tenants.get(tenant_id) or self.tenants.get("*")


DENY_ALL = PolicyDocument()


class VersionedPolicy(NamedTuple):
    """A tenant's stored policy and its version (unpacks as ``policy, version``)."""

    policy: TenantPolicy
    version: int


class UnknownTools(InvalidParameters):
    """A policy names tool ids the registry does not know (a typo, or not yet registered)."""

    def __init__(self, unknown: dict[str, str]) -> None:
        names = ", ".join(sorted(set(unknown.values())))
        super().__init__(
            f"the policy names tools that are not registered: {names}",
            details={"unknown_tools": sorted(set(unknown.values())), "locations": unknown},
        )
        self.unknown = unknown
        """Dotted location in the document (``allow_tools.1``) -> the unknown tool id."""

    @property
    def tool_ids(self) -> list[str]:
        return sorted(set(self.unknown.values()))


def load_policy(path: Path | None) -> PolicyDocument:
    """Load a YAML or JSON document; no path means deny everything."""
    if path is None:
        return DENY_ALL
    return PolicyDocument.model_validate(parse_text(path.read_text(), json_=path.suffix == ".json"))


def parse_text(text: str, *, json_: bool) -> Any:
    """The data of a YAML or JSON policy text (an empty text is an empty mapping)."""
    if json_:
        data = json.loads(text)
    else:
        import yaml  # here: a worker that reads its policies from Postgres never needs it

        data = yaml.safe_load(text)
    return {} if data is None else data


def matches_any(tool_id: str, patterns: Collection[str]) -> bool:
    return any(fnmatch.fnmatchcase(tool_id, p) for p in patterns)


def allowed_by(tool_id: str, patterns: Collection[str], *, source_tool: bool = False) -> bool:
    """Whether allow ``patterns`` admit ``tool_id``; a source tool needs its exact id.

    Tools from MCP servers and HTTP sources (``source_tool``: the manifest's
    ``source_type`` is mcp or http) are untrusted: ``*``, ``acme__*`` or ``mcp__*``
    never allows them, so a tool a server adds at run time stays disabled until named.
    """
    if is_untrusted(tool_id, source_tool=source_tool):
        return tool_id in patterns
    return matches_any(tool_id, patterns)


def is_glob(pattern: str) -> bool:
    """Whether ``pattern`` matches more than one literal id."""
    return any(c in _GLOB_CHARS for c in pattern)


def named_tools(policy: TenantPolicy) -> Iterator[tuple[str, str]]:
    """Every ``(location, pattern)`` of a tool id or glob the policy names."""
    for i, p in enumerate(policy.allow_tools):
        yield f"allow_tools.{i}", p
    for i, p in enumerate(policy.deny_tools):
        yield f"deny_tools.{i}", p
    for p in policy.tool_versions:
        yield f"tool_versions.{p}", p
    for p in policy.tool_budgets:
        yield f"tool_budgets.{p}", p
    for did, agent in policy.agents.items():
        for i, p in enumerate(agent.allow_tools or []):
            yield f"agents.{did}.allow_tools.{i}", p
        for i, p in enumerate(agent.deny_tools):
            yield f"agents.{did}.deny_tools.{i}", p


def unknown_tools(policy: TenantPolicy, known: Collection[str]) -> dict[str, str]:
    """Literal (non-glob) tool ids the policy names that are not in ``known``, by location."""
    return {
        where: pattern
        for where, pattern in named_tools(policy)
        if not is_glob(pattern) and pattern not in known
    }


def check_known_tools(policy: TenantPolicy, known: Collection[str]) -> None:
    """Raise :class:`UnknownTools` when the policy names a literal id ``known`` lacks.

    Globs are not checked: ``acme__*`` may name tools registered later. Applied when a
    policy is written through the API or CLI; a seed file is not checked (at start the
    executors may not have registered their tools yet).
    """
    unknown = unknown_tools(policy, known)
    if unknown:
        raise UnknownTools(unknown)
