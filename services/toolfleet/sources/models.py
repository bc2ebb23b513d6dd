"""What an operator registers (a source) and what the fleet learns from it (its tools).

Pure pydantic, no I/O: the store keeps these as JSON, the API and CLI exchange them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from toolfleet.contract.manifest import SourceType, ToolManifest
from toolfleet.contract.result_rules import ResultRules
from toolfleet.errors import ErrorInfo
from toolfleet.events.models import TENANT_ID_PATTERN, TOOL_ID_PATTERN

#: Source names become part of tool ids: lower-case words joined by ``_``.
SOURCE_NAME_PATTERN = r"^[a-z][a-z0-9_]{0,47}$"
GLOBAL_TENANT = "*"
DEFAULT_MAX_RESPONSE_BYTES = 10 * 1_048_576
_TEMPLATE_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")

#: How a source's tools came to be known: listed when it was added (or replaced), on the
#: server's ``tools/list_changed``, or on a refresh (a retry, ``sources refresh``).
Discovery = Literal["add", "list_changed", "refresh"]
ToolEffect = Literal["read_only", "state_change", "external_side_effect"]
#: A source tool's effect until an operator sets another: a source cannot vouch for itself.
UNVOUCHED_EFFECT: ToolEffect = "external_side_effect"


class SourceKind(StrEnum):
    MCP_STDIO = "mcp_stdio"
    """An MCP server the executor starts and talks to over stdin/stdout."""
    MCP_HTTP = "mcp_http"
    """An MCP server reached over Streamable HTTP."""
    HTTP = "http"
    """An HTTP API whose operations are declared (or imported from OpenAPI 3)."""


class HttpOperation(BaseModel):
    """One HTTP operation as a tool: where each input field goes, what comes back."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    operation_id: str = Field(pattern=r"^[a-z0-9][a-z0-9_]{0,63}$")
    tool_id: str | None = Field(default=None, pattern=TOOL_ID_PATTERN, max_length=128)
    """The tool's manifest id (``acme__get_pet``), kept as declared; none:
    ``http__{source}__{operation_id}``. Ids starting ``mcp__`` are MCP servers' own."""
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "GET"
    url: str
    """URL template, absolute or relative to the source's base URL: ``/pets/{pet_id}``."""
    description: str = ""
    path: list[str] = Field(default_factory=list)
    """Input fields substituted into the URL template."""
    query: list[str] = Field(default_factory=list)
    """Input fields sent as query parameters."""
    body: list[str] = Field(default_factory=list)
    """Input fields sent as the JSON body's members."""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    output_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    """Schema of the JSON answer; a non-object answer is wrapped as ``{"value": ...}``."""
    effect: ToolEffect | None = None
    """The operator's word on what it does; none: ``external_side_effect`` whatever the
    method (a GET may change state: only an operator vouches for an API)."""

    @model_validator(mode="after")
    def _fields_placed_once(self) -> HttpOperation:
        if self.tool_id is not None and self.tool_id.startswith("mcp__"):
            raise ValueError("tool ids starting mcp__ belong to MCP servers' tools")
        placed = [*self.path, *self.query, *self.body]
        if len(set(placed)) != len(placed):
            raise ValueError("an input field may go to one place only (path, query or body)")
        missing = set(_TEMPLATE_FIELD.findall(self.url)) - set(self.path)
        if missing:
            raise ValueError(f"the URL template names fields not in `path`: {sorted(missing)}")
        return self

    @property
    def hints(self) -> dict[str, Any]:
        """What the API's own description suggests (shown to operators, never trusted)."""
        return {"method": self.method}


class SourceDefinition(BaseModel):
    """A source as stored: who may use it, how to reach it, how its results are exposed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=SOURCE_NAME_PATTERN)
    tenant_id: str = Field(default=GLOBAL_TENANT, pattern=rf"^\*$|{TENANT_ID_PATTERN}")
    """The one tenant whose calls may use it, or ``*`` for every tenant."""
    kind: SourceKind
    target: str = Field(min_length=1, max_length=4096)
    """Command line (``mcp_stdio``), MCP URL (``mcp_http``) or base URL (``http``)."""
    connection_id: str | None = Field(default=None, max_length=200)
    """Connection whose credentials are sent as headers (HTTP kinds)."""
    credential_headers: dict[str, str] = Field(default_factory=dict)
    """Header name → credential name of the connection (``Authorization: api_token``):
    sent with every call (``http``) or on the session (``mcp_http``)."""
    credential_env: dict[str, str] = Field(default_factory=dict)
    """Environment variable → credential name, for a ``mcp_stdio`` server's process."""
    filesystem_permissions: list[str] = Field(default_factory=list)
    """Host paths a sandboxed ``mcp_stdio`` server sees (``/path`` read-only, ``rw:/path``
    writable); nothing else of the host's files but the system's programs."""
    network_permissions: list[str] = Field(default_factory=list)
    """Hosts a sandboxed ``mcp_stdio`` server may reach through the egress proxy (the
    token's syntax); none: no network at all."""
    redaction: dict[str, list[str]] = Field(default_factory=dict)
    """Tool name on the source → result fields clients may see (none: ``content`` for an
    MCP tool, the output schema's fields for an HTTP operation)."""
    result_rules: dict[str, ResultRules] = Field(default_factory=dict)
    """Tool name on the source → what the validator checks besides the schema
    (validation mode, sanitization, size limit); none: strict, unsanitized."""
    operations: list[HttpOperation] = Field(default_factory=list)
    timeout_s: float = Field(default=30.0, gt=0, le=3600)
    max_response_bytes: int = Field(default=DEFAULT_MAX_RESPONSE_BYTES, ge=1, le=1 << 30)
    """Largest (decoded) answer body an HTTP operation may return, and largest message
    (one JSON-RPC line) a ``mcp_stdio`` server may send: past it the call is
    ``result_too_large`` and the rest is not read (a stdio server's session is restarted).
    Default 10 MiB; it bounds the memory one session holds."""
    effects: dict[str, ToolEffect] = Field(default_factory=dict)
    """Tool name on the source → the effect an operator vouches for (``toolfleet sources
    configure NAME TOOL --effect read_only``); none: ``external_side_effect``. A server's
    hints (``readOnlyHint``, an HTTP method) never lower it."""
    idle_s: float = Field(default=300.0, gt=0)
    """A session unused this long is closed (its stdio server stopped)."""

    @model_validator(mode="after")
    def _kind_fits(self) -> SourceDefinition:
        if self.kind is SourceKind.HTTP:
            if not self.operations:
                raise ValueError("an http source declares at least one operation")
            if not self.target.startswith(("http://", "https://")):
                raise ValueError("an http source's target is its base URL (http or https)")
        elif self.operations:
            raise ValueError("only http sources declare operations")
        names = [op.operation_id for op in self.operations]
        if len(set(names)) != len(names):
            raise ValueError("operation ids repeat within the source")
        declared = [op.tool_id for op in self.operations if op.tool_id is not None]
        if len(set(declared)) != len(declared):
            raise ValueError("tool ids repeat within the source")
        if self.credential_env and self.kind is not SourceKind.MCP_STDIO:
            raise ValueError("credential_env is for mcp_stdio sources (their process)")
        if (
            self.filesystem_permissions or self.network_permissions
        ) and self.kind is not SourceKind.MCP_STDIO:
            raise ValueError("filesystem and network permissions are for mcp_stdio sources")
        if self.credential_headers and self.kind is SourceKind.MCP_STDIO:
            raise ValueError("credential_headers is for http and mcp_http sources")
        if (self.credential_env or self.credential_headers) and not self.connection_id:
            raise ValueError("credentials need the connection_id that holds them")
        if self.kind is SourceKind.MCP_HTTP and not self.target.startswith(("http://", "https://")):
            raise ValueError("an mcp_http source's target is its URL (http or https)")
        return self


class SourceTool(BaseModel):
    """One tool a source offers, at one schema (so one version)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool_id: str
    version: str
    source: str
    source_type: Literal["mcp", "http"]
    """Where it comes from (the manifest's ``source_type``): what makes it untrusted."""
    tenant_id: str = GLOBAL_TENANT
    remote_name: str
    """Its name on the MCP server, or the HTTP operation id."""
    description: str = ""
    effect: ToolEffect
    """``external_side_effect`` unless an operator set another (the source's ``effects``,
    or an HTTP operation's declared ``effect``)."""
    hints: dict[str, Any] = Field(default_factory=dict)
    """What the source says of the tool (MCP annotations, the HTTP method): shown to
    operators, never trusted."""
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    redaction_allowlist: list[str]
    result_rules: ResultRules = Field(default_factory=ResultRules)
    timeout_seconds: float

    @model_validator(mode="before")
    @classmethod
    def _source_type_of_older_rows(cls, data: Any) -> Any:
        # Rows stored before ``source_type`` existed: only MCP tools had the mcp__ prefix.
        if isinstance(data, dict) and "source_type" not in data:
            tool_id = str(data.get("tool_id", ""))
            return {**data, "source_type": "mcp" if tool_id.startswith("mcp__") else "http"}
        return data


def manifest_of(tool: SourceTool) -> ToolManifest:
    return ToolManifest(
        tool_id=tool.tool_id,
        version=tool.version,
        effect=tool.effect,
        description=tool.description,
        tags=[f"source:{tool.source}"],
        source_type=SourceType(tool.source_type),
        input_schema=tool.input_schema,
        output_schema=tool.output_schema,
        redaction_allowlist=tool.redaction_allowlist,
        result_rules=tool.result_rules,
        timeout_seconds=tool.timeout_seconds,
    )


@dataclass(frozen=True, kw_only=True)
class ListingLimits:
    """What one listing of a source's tools may cost; past any, it fails typed."""

    max_tools: int = 1000
    """Tools one source may list (``result_too_large`` past it)."""
    max_bytes: int = 8 * 1_048_576
    """Bytes of tool definitions (names, descriptions, schemas) one listing may hold."""
    max_pages: int = 100
    """Pages of ``tools/list`` followed before the listing is ``result_too_large``."""
    max_seconds: float = 300.0
    """A listing takes at most the source's ``timeout_s`` and never longer than this
    (starting the server included): past it, ``timeout`` (retryable)."""

    def deadline_s(self, source: SourceDefinition) -> float:
        return min(source.timeout_s, self.max_seconds)


LISTING_LIMITS = ListingLimits()


class ListingState(StrEnum):
    """Where a source's tool listing stands (``GET /v1/sources/{name}/listing``)."""

    PENDING = "pending"
    """Requested (the source was added, replaced or refreshed); no executor answered yet."""
    READY = "ready"
    """An executor (or, for an HTTP source, the API from its declared operations) listed
    the tools and registered them."""
    FAILED = "failed"
    """The last attempt failed; ``error`` says why. A retryable failure is tried again
    from ``next_attempt_at``."""


class SourceListing(BaseModel):
    """A source's tool listing as the API shows it: asked for by the API, done by an
    executor (the API never starts or reaches a source itself)."""

    model_config = ConfigDict(extra="forbid")

    source: str
    tenant_id: str
    """The source's tenant (``*``: every tenant) when the listing was requested."""
    state: ListingState
    request: int = 1
    """Which request the state answers: each add, replacement or refresh is one more."""
    requested_at: datetime
    attempts: int = 0
    """Attempts since the last request (a retry after a retryable failure counts)."""
    listed_at: datetime | None = None
    """When the last attempt ended (listed or failed)."""
    listed_by: str | None = None
    """The worker that made the last attempt (``api`` for an HTTP source's declared tools)."""
    tools: int | None = None
    """How many tools the last successful listing found."""
    error: ErrorInfo | None = None
    """Why the last attempt failed (``timeout``, ``result_too_large``, ...)."""
    next_attempt_at: datetime | None = None
    """When executors try a retryable failure again; none: only a new request does."""
