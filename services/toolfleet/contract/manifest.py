"""What the registry stores about one tool version (no I/O).

A manifest is what an executor registers (id, version, schemas, effect, what the tool
needs and how it is run) plus the lifecycle operators change later (state, dates,
successor). ``schemas/manifest.json`` is generated from :class:`ToolManifest`.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolfleet.contract.result_rules import ResultRules
from toolfleet.events.models import TOOL_ID_PATTERN, Effect
from toolfleet.events.types import DEFAULT_POOL, POOL_NAME_PATTERN


class LifecycleState(StrEnum):
    """Where a version is in its life: ``active → deprecated → sunset → removed``."""

    ACTIVE = "active"
    """Resolved normally."""
    DEPRECATED = "deprecated"
    """Still runs; from its ``deprecation_date`` on, every call's outcome carries a warning
    naming the successor and date (before it, the version reads as active)."""
    SUNSET = "sunset"
    """Runs only for tenants whose policy pins this exact version; else ``tool_removed``."""
    REMOVED = "removed"
    """Never runs and is hidden from lists."""


#: The order of the states: a version only ever moves forward.
LIFECYCLE_ORDER: tuple[LifecycleState, ...] = tuple(LifecycleState)


class SourceType(StrEnum):
    """Where a tool's code lives."""

    NATIVE = "native"
    """A ``@tool`` function in the executor's process."""
    MCP = "mcp"
    """A tool of a registered MCP server."""
    HTTP = "http"
    """An HTTP endpoint described by a manifest."""
    COMMAND = "command"
    """A command line run in the sandbox."""


class ToolCategory(StrEnum):
    """The fixed set of categories; free-form grouping goes in ``tags``."""

    CORE = "core"
    GENERAL = "general"
    DATA = "data"
    SEARCH = "search"
    WEB = "web"
    FILES = "files"
    COMMUNICATION = "communication"
    COMPUTE = "compute"
    DEVELOPER = "developer"
    FINANCE = "finance"
    KNOWLEDGE = "knowledge"
    MEDIA = "media"
    PRODUCTIVITY = "productivity"
    SECURITY = "security"
    TEST = "test"


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class FilesystemAccess(_Part):
    """One path the tool reads (or writes) inside its sandbox."""

    path: str = Field(min_length=1, max_length=1024)
    """A path or glob inside the tool's sandbox."""
    access: Literal["read", "write"] = "read"


class ToolPermissions(_Part):
    """What the tool reaches outside its own process."""

    filesystem: list[FilesystemAccess] = Field(default_factory=list)
    network: list[str] = Field(default_factory=list)
    """Hosts (``api.example.com``, ``*.example.com``) the tool connects to; empty: none."""
    credentials: list[str] = Field(default_factory=list)
    """Named credentials; a call must then carry a ``connection_id``."""


class RetrySettings(_Part):
    """Retries of retryable errors, with exponential backoff and full jitter."""

    max_attempts: int = Field(default=1, ge=1)
    """Attempts in all (1: no retries)."""
    initial_backoff_s: float = Field(default=0.2, ge=0)
    max_backoff_s: float = Field(default=5.0, ge=0)


class CircuitSettings(_Part):
    """The circuit breaker the tool's calls go through."""

    name: str = ""
    """Circuit name (empty: the tool id); tools calling one upstream may share it."""
    failure_rate: float = Field(default=0.5, gt=0, le=1)
    minimum_calls: int = Field(default=5, ge=1)
    window_size: int = Field(default=20, ge=1)
    slow_call_s: float = Field(default=10.0, gt=0)
    open_s: float = Field(default=30.0, gt=0)
    half_open_calls: int = Field(default=3, ge=1)


class ResourceDefaults(_Part):
    """Limits a call runs under unless its request asks for less."""

    cpu_millicore_limit: int | None = Field(default=None, ge=1)
    memory_mb_limit: int | None = Field(default=None, ge=1)


class ToolManifest(BaseModel):
    """One version of one tool, as executors register it and policy resolves it."""

    model_config = ConfigDict(frozen=True, extra="ignore", use_attribute_docstrings=True)

    tool_id: str = Field(pattern=TOOL_ID_PATTERN, max_length=128)
    version: str
    effect: Effect
    description: str = ""
    category: ToolCategory = ToolCategory.GENERAL
    tags: list[str] = Field(default_factory=list)
    keywords: list[str] = Field(default_factory=list)
    """Words people search for this tool by that its name and description do not say
    (synonyms, slang: ``["sms", "text", "ping"]``); tool search ranks by them. Not part
    of the version's contract: re-registering the version with others replaces them."""
    source_type: SourceType = SourceType.NATIVE
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    redaction_allowlist: list[str]
    timeout_seconds: float = Field(gt=0)
    credentials: list[str] = Field(default_factory=list)
    """Named credentials the tool needs (the same list as ``permissions.credentials``)."""
    permissions: ToolPermissions = Field(default_factory=ToolPermissions)
    retry_policy: RetrySettings = Field(default_factory=RetrySettings)
    circuit: CircuitSettings = Field(default_factory=CircuitSettings)
    requires_approval: bool = False
    """Every call waits for an approver, whatever the tenant's policy says."""
    resource_defaults: ResourceDefaults = Field(default_factory=ResourceDefaults)
    isolation: str = Field(default="sandbox", pattern="^(none|process|sandbox)$")
    """Where the executor runs it: ``none``, ``process`` or ``sandbox``."""
    command: list[str] = Field(default_factory=list)
    """A command tool's executable and arguments (empty: a Python tool)."""
    pool: str = Field(default=DEFAULT_POOL, pattern=POOL_NAME_PATTERN)
    """The executor pool that runs it: policy publishes its calls on the pool's topic
    (``invoke.authorized.<pool>``; ``invoke.authorized`` for ``default``), read by the
    executors started with ``--pool <pool>``. A deployment setting, not part of the
    version's contract: re-registering the version with another pool moves it."""
    lifecycle_state: LifecycleState = LifecycleState.ACTIVE
    deprecation_message: str | None = None
    deprecation_date: datetime | None = None
    """From when the version is deprecated: callers are warned from then on (it may be
    announced ahead; before it, the version is active)."""
    sunset_date: datetime | None = None
    """From when only tenants pinning it may call it (past it, a deprecated version is
    sunset)."""
    deprecated_in_favor_of: str | None = None
    """The successor: a version of this tool (``2.0.0``) or another tool (``acme__x@1.0.0``)."""

    @model_validator(mode="after")
    def _one_credentials_list(self) -> ToolManifest:
        # ``credentials`` predates ``permissions``: either spelling declares the same list.
        merged = sorted(set(self.credentials) | set(self.permissions.credentials))
        if merged != sorted(self.credentials) or merged != sorted(self.permissions.credentials):
            object.__setattr__(self, "credentials", merged)
            object.__setattr__(
                self, "permissions", self.permissions.model_copy(update={"credentials": merged})
            )
        return self

    result_rules: ResultRules = Field(default_factory=ResultRules)
    """What the validator checks besides the output schema: mode, sanitization, limits."""

    @property
    def namespace(self) -> str:
        return self.tool_id.split("__", 1)[0]

    @property
    def schema_hash(self) -> str:
        """Identity of the contract of this version: same id+version must keep it."""
        return schema_hash(self.input_schema, self.output_schema, self.effect)

    def state_at(self, now: datetime) -> LifecycleState:
        """The lifecycle state in force at ``now`` (its dates decide, once deprecated)."""
        return effective_state(
            self.lifecycle_state,
            now,
            deprecation_date=self.deprecation_date,
            sunset_date=self.sunset_date,
        )


def effective_state(
    state: LifecycleState,
    now: datetime,
    *,
    deprecation_date: datetime | None = None,
    sunset_date: datetime | None = None,
) -> LifecycleState:
    """``state`` as of ``now``: a deprecated or sunset version follows its dates (sunset
    from ``sunset_date``, deprecated from ``deprecation_date``, active before)."""
    if state not in {LifecycleState.DEPRECATED, LifecycleState.SUNSET}:
        return state
    if sunset_date is not None and sunset_date <= now:
        return LifecycleState.SUNSET
    if deprecation_date is not None and now < deprecation_date:
        return LifecycleState.ACTIVE
    if sunset_date is not None:
        return LifecycleState.DEPRECATED
    return state


def schema_hash(input_schema: dict[str, Any], output_schema: dict[str, Any], effect: str) -> str:
    canonical = json.dumps(
        {"in": input_schema, "out": output_schema, "effect": str(effect)},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()
