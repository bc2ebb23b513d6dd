"""Pydantic models of every event's ``data`` (no I/O here).

Inbound models from producers (``InvokeRequested``, control events) are strict:
an unknown field is an error, so a misspelled ``require_approval`` can never be
silently ignored. Models exchanged between toolfleet's own services ignore unknown
fields so that services can be upgraded one at a time.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, field_validator

from toolfleet.errors import ErrorInfo
from toolfleet.events.types import POOL_NAME_PATTERN

TOOL_ID_PATTERN = r"^[a-z][a-z0-9_]*__[a-z0-9][a-z0-9_]*$"
TENANT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
MAX_PARAMETER_DEPTH = 64
"""Deepest nesting accepted in ``parameters``: deeper ones could be decoded but not
re-serialized by the stages that forward them (pydantic stops at ~255 levels)."""


def nesting_depth_exceeds(value: object, limit: int) -> bool:
    """Whether JSON-like ``value`` nests more than ``limit`` containers deep (iterative)."""
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth >= limit:
                return True
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return False


class _Inbound(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class _Internal(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, use_attribute_docstrings=True)


class InvocationStatus(StrEnum):
    """Status of an invocation, as the status API reports it."""

    PENDING = "pending"
    PENDING_APPROVAL = "pending_approval"
    QUEUED = "queued"
    """Authorized, waiting for an executor of its pool (``execution_metadata.pool``)."""
    RUNNING = "running"
    SUCCESS = "success"
    ERROR = "error"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    PERMISSION_DENIED = "permission_denied"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_STATUSES


_TERMINAL_STATUSES = frozenset(
    {
        InvocationStatus.SUCCESS,
        InvocationStatus.ERROR,
        InvocationStatus.TIMEOUT,
        InvocationStatus.CANCELLED,
        InvocationStatus.PERMISSION_DENIED,
    }
)


class Effect(StrEnum):
    """What running a tool does to the world."""

    READ_ONLY = "read_only"
    STATE_CHANGE = "state_change"
    EXTERNAL_SIDE_EFFECT = "external_side_effect"


class Priority(StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


# --- invoke request ------------------------------------------------------------------


class AgentContext(_Inbound):
    agent_did: str = Field(min_length=1, max_length=512)
    """Decentralized identifier of the calling agent."""
    tenant_id: str = Field(pattern=TENANT_ID_PATTERN)
    """Tenant; must equal the ``tenantid`` attribute and the message key."""
    user_did: str | None = Field(default=None, max_length=512)
    """The human on whose behalf the agent acts, when there is one."""
    session_id: str = Field(default="", max_length=512)


class ResourceLimits(_Inbound):
    cpu_millicore_limit: int | None = Field(default=None, ge=1)
    memory_mb_limit: int | None = Field(default=None, ge=1)
    timeout_seconds: float | None = Field(default=None, gt=0, le=86_400)
    """Upper bound on the tool's run time; the tool's own timeout applies if lower."""


class CheckpointConfig(_Inbound):
    enable_checkpointing: bool = True
    checkpoint_interval_seconds: float = Field(default=30, ge=0)
    resume_from_checkpoint_id: str | None = None


class ExecutionOptions(_Inbound):
    async_mode: bool = True
    """``false``: ``POST /v1/invocations`` answers ``200`` with the outcome if the call
    ends within ``TOOLFLEET_SYNC_INVOKE_WAIT_S`` (else ``202``). Kafka producers wait
    on the results topic themselves; the pipeline ignores it."""
    priority: Priority = Priority.NORMAL
    idempotency_key: str | None = Field(default=None, max_length=256)
    require_approval: bool = False


DOCUMENT_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,255}$"


class DocumentRef(_Inbound):
    """One document a call may read through ``ctx.documents``."""

    document_id: str = Field(pattern=DOCUMENT_ID_PATTERN)
    version: str | None = Field(default=None, min_length=1, max_length=128)
    """Pin: the call reads exactly this version. None: the version current at the
    call's first read of it, kept for the rest of the call (resumes included)."""


class DocumentContext(_Inbound):
    """The specification's ``document_context``: which documents a call may read."""

    documents: list[DocumentRef] = Field(default_factory=list, max_length=256)
    """The only documents ``ctx.documents`` lets the tool read (each id once)."""
    source: str | None = Field(default=None, max_length=256)
    """Name of the document source to read them from (None: the fleet's only one)."""

    @field_validator("documents")
    @classmethod
    def _unique(cls, value: list[DocumentRef]) -> list[DocumentRef]:
        ids = [ref.document_id for ref in value]
        if len(ids) != len(set(ids)):
            raise ValueError("a document_id is named more than once")
        return value


class DocumentAccess(_Internal):
    """One document a call read: an entry of the outcome's ``documents_accessed``."""

    document_id: str
    version: str
    """The version the tool was given (the call's pin)."""
    access: Literal["read", "metadata", "search"]
    """``read``: its content; ``metadata``: its metadata; ``search``: a search hit."""


class InvokeRequested(_Inbound):
    """``ai.agent.tool.invoke.requested``: an agent asks for a tool call."""

    invocation_id: UUID | None = None
    """Defaults to the event id."""
    tool_id: str = Field(min_length=1, max_length=256)
    tool_version: str = Field(default="*", max_length=64)
    """Exact version, or a range (``^1.2.0``, ``~1.2``, ``*``: newest active)."""
    agent_context: AgentContext
    parameters: dict[str, Any] = Field(default_factory=dict)
    capability_token: str | None = Field(default=None, repr=False, max_length=16_384)
    """JWT (RS256). Dropped by policy once verified; never forwarded."""
    connection_id: str | None = Field(default=None, max_length=256)
    resource_limits: ResourceLimits = Field(default_factory=ResourceLimits)
    checkpoint_config: CheckpointConfig = Field(default_factory=CheckpointConfig)
    execution_options: ExecutionOptions = Field(default_factory=ExecutionOptions)
    document_context: DocumentContext | None = None
    """Documents the tool may read through ``ctx.documents`` (None: none)."""

    @field_validator("parameters")
    @classmethod
    def _not_too_deep(cls, value: dict[str, Any]) -> dict[str, Any]:
        # The parameters dict itself is level 1.
        if nesting_depth_exceeds(value, MAX_PARAMETER_DEPTH):
            raise ValueError(f"parameters nest deeper than {MAX_PARAMETER_DEPTH} levels")
        return value


# --- pipeline hops -------------------------------------------------------------------


class InvokeAuthorized(_Internal):
    """``ai.agent.tool.invoke.authorized``: policy allowed the call; the token is gone."""

    invocation_id: UUID
    tool_id: str
    tool_version: str
    """The resolved, exact version."""
    requested_version: str
    agent_context: AgentContext
    parameters: dict[str, Any]
    connection_id: str | None = None
    effect: Effect
    timeout_seconds: float
    """Effective timeout: the tool's, capped by the request's limit."""
    resource_limits: ResourceLimits = Field(default_factory=ResourceLimits)
    checkpoint_config: CheckpointConfig = Field(default_factory=CheckpointConfig)
    execution_options: ExecutionOptions = Field(default_factory=ExecutionOptions)
    document_context: DocumentContext | None = None
    """The request's ``document_context``, as policy received it."""
    warnings: list[str] = Field(default_factory=list)
    requested_at: datetime
    max_result_bytes: int | None = None
    """The tenant's result budget; a larger result ends in ``resource_exhausted``."""
    max_concurrent_per_agent: int = 4
    """Calls of this agent that may run at once; the rest wait (they are not failed)."""
    grant: str | None = Field(default=None, repr=False)
    """Policy's signed execution grant, bound to this call. Not the capability token:
    executors verify it before running anything (defence in depth)."""
    pool: str = Field(
        default="default", pattern=POOL_NAME_PATTERN, exclude_if=lambda pool: pool == "default"
    )
    """The executor pool of the tool (its manifest's ``pool``): the event travels on that
    pool's topic. Set by policy from the registry; a request cannot choose it. Absent
    for the default pool (the event is then as it was before pools)."""


class CheckpointRef(_Internal):
    checkpoint_id: str
    checkpoint_type: Literal["micro", "macro", "named"] = "micro"
    timestamp: datetime


class Attachment(_Internal):
    kind: Literal["blob"] = "blob"
    url: str
    content_type: str
    bytes: int


class ExecutionMetadata(_Internal):
    duration_ms: int = 0
    started_at: datetime | None = None
    completed_at: datetime | None = None
    attempts: int = 1
    cpu_used_millicore_seconds: float = 0
    memory_peak_mb: float = 0
    checkpoints_created: list[CheckpointRef] = Field(default_factory=list)
    cached: bool = False
    truncated: bool = False
    attachments: list[Attachment] = Field(default_factory=list)
    resumed_from_checkpoint_id: str | None = None
    """Checkpoint this execution resumed from, if it resumed."""


class ResultBlob(_Internal):
    """Where a result too large for the event waits (Postgres ``result_blobs``)."""

    blob_id: str = Field(min_length=1, max_length=64)
    bytes: int = Field(ge=0)


class InvokeExecuted(_Internal):
    """``ai.agent.tool.invoke.executed``: the tool returned; the result is unvalidated."""

    invocation_id: UUID
    tool_id: str
    tool_version: str
    agent_context: AgentContext
    result: dict[str, Any]
    """The result; ``{}`` when it is in ``result_blob`` instead."""
    result_blob: ResultBlob | None = None
    """Set when the result was larger than ``TOOLFLEET_RESULT_INLINE_BYTES``."""
    warnings: list[str] = Field(default_factory=list)
    execution_metadata: ExecutionMetadata
    checkpoint_ref: str | None = None
    documents_accessed: list[DocumentAccess] = Field(default_factory=list)
    """Documents the tool read through ``ctx.documents``, each once per access kind."""


class ToolOutcome(_Internal):
    """Terminal outcome (``succeeded|failed|timeout|cancelled``), contract section 3."""

    invocation_id: UUID
    status: InvocationStatus
    agent_did: str
    tenant_id: str
    tool_id: str
    tool_version: str | None = None
    result: dict[str, Any] | None = None
    error: ErrorInfo | None = None
    warnings: list[str] = Field(default_factory=list)
    execution_metadata: ExecutionMetadata = Field(default_factory=ExecutionMetadata)
    checkpoint_ref: str | None = None
    documents_accessed: list[DocumentAccess] = Field(default_factory=list)
    """Documents the tool read through ``ctx.documents`` (id, pinned version, access)."""
    signature: str | None = Field(default=None, max_length=4096, repr=False)
    """Outcome signature (compact JWS, HS256 with a key derived from the execution-grant
    key) over the invocation, tenant, event type, status and the SHA-256 of the rest of
    this body (:mod:`toolfleet.auth.outcomes`). Set by the service that sends the
    outcome; status, policy and ``toolfleet.client`` ignore an outcome without a valid
    one (``ai.agent.tool.outcome.refused``)."""


# --- lifecycle notifications (toolfleet.invoke.events) ---------------------------------


class InvokeQueued(_Internal):
    """``ai.agent.tool.invoke.queued``: the call waits for an executor of its pool."""

    invocation_id: UUID
    tenant_id: str
    agent_did: str
    tool_id: str
    tool_version: str
    pool: str
    """The pool whose executors may run it."""
    reason: Literal["no_live_executor", "tool_not_loaded"]
    """``no_live_executor``: no executor of the pool was live when policy authorized the
    call (written by policy). ``tool_not_loaded``: the executor of the pool that read it
    lacks the tool and no live one has it (written by that executor, ``worker_id``)."""
    worker_id: str | None = None
    """The executor that lacked the tool (``tool_not_loaded``)."""
    deadline: datetime
    """When it ends ``timeout`` if no executor has started it by then."""
    at: datetime


class ToolInvoked(_Internal):
    """``ai.agent.tool.invoked``: an executor started running the tool."""

    invocation_id: UUID
    tenant_id: str
    agent_did: str
    tool_id: str
    tool_version: str
    attempt: int = 1
    worker_id: str
    started_at: datetime
    resumed_from_checkpoint_id: str | None = None


class CheckpointCreated(_Internal):
    """``ai.agent.tool.checkpoint.created``; the state itself stays in Redis."""

    invocation_id: UUID
    tenant_id: str
    tool_id: str
    checkpoint_id: str
    checkpoint_type: Literal["micro", "macro", "named"] = "micro"
    progress_percent: float = Field(ge=0, le=100)
    current_phase: str = ""
    timestamp: datetime


class ApprovalRequested(_Internal):
    """``ai.agent.tool.approval.requested``: the call waits for a human."""

    invocation_id: UUID
    tenant_id: str
    agent_did: str
    tool_id: str
    tool_version: str
    effect: Effect
    reason: str
    parameters_hash: str
    """SHA-256 of the canonical tool, version and parameters the approval binds to."""
    expires_at: datetime


class CircuitChanged(_Internal):
    """``ai.agent.circuit.opened`` / ``ai.agent.circuit.closed``."""

    circuit_name: str
    state: Literal["open", "closed", "half_open"]
    reason: str = ""
    retry_after_s: float | None = None
    at: datetime


class EgressDecided(_Internal):
    """``ai.agent.tool.egress``: the sandbox egress proxy allowed or refused a connection.

    Never a header, a path or a body: the host, port, method and why."""

    invocation_id: UUID
    tenant_id: str
    host: str
    """The target host as normalized; empty when the request could not be read."""
    port: int
    method: str
    """``CONNECT`` or the forwarded request's method; empty when unreadable."""
    decision: Literal["allowed", "refused", "failed"]
    reason: str
    """``granted``, ``not_granted``, ``private_address``, ``connect_failed``, ..."""
    address: str | None = None
    """The address connected to, or the non-public one refused."""
    at: datetime


class ToolLifecycleChanged(_Internal):
    """``ai.agent.tool.lifecycle.changed``: an operator moved a tool version along its
    lifecycle (``active → deprecated → sunset → removed``)."""

    tool_id: str
    tool_version: str
    previous_state: str
    lifecycle_state: str
    operator: str
    """Subject of the operator's token (also in ``authid``)."""
    deprecation_date: datetime | None = None
    sunset_date: datetime | None = None
    deprecated_in_favor_of: str | None = None
    at: datetime


class SourceToolAdded(_Internal):
    """``ai.agent.tool.source.tool_added``: a tool source (an MCP server) added a tool
    while the fleet ran. It is registered but disabled: no policy allows it until an
    operator names it."""

    source: str
    """The source's name."""
    source_tenant_id: str
    """The one tenant the source serves, or ``*`` for every tenant."""
    tool_id: str
    tool_version: str
    enabled: bool = False
    at: datetime


# --- control (toolfleet.invoke.control) ---------------------------------------------


class CancelRequested(_Inbound):
    """``ai.agent.tool.cancel.requested``."""

    invocation_id: UUID
    tenant_id: str = Field(pattern=TENANT_ID_PATTERN)
    requested_by: str = Field(default="", max_length=512)
    """Who asked for the cancellation (the token subject); bound by ``signature``."""
    reason: str = Field(default="", max_length=1024)
    signature: str | None = Field(default=None, max_length=4096, repr=False)
    """Control signature (compact JWS, HS256 with a key derived from the execution-grant
    key) over the invocation, tenant, action, ``requested_by`` and issue time. Policy
    refuses a cancel without a valid one (the refusal is audited)."""


class ApprovalDecision(_Inbound):
    """``ai.agent.tool.approval.granted`` / ``ai.agent.tool.approval.denied``."""

    invocation_id: UUID
    tenant_id: str = Field(pattern=TENANT_ID_PATTERN)
    approver: str = Field(default="", max_length=512)
    """Who decided (the approver token's subject); bound by ``signature``."""
    reason: str = Field(default="", max_length=1024)
    parameters_hash: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """The ``parameters_hash`` of the ``approval.requested`` the approver looked at: a
    decision naming another hash changes nothing (the call stays pending)."""
    signature: str | None = Field(default=None, max_length=4096, repr=False)
    """Control signature (compact JWS, HS256 with a key derived from the execution-grant
    key) over the invocation, tenant, decision, ``approver``, issue time and
    ``parameters_hash``. Policy refuses a decision without a valid one: the call stays
    pending and the refusal is audited (``ai.agent.tool.control.refused``)."""


class ControlRefused(_Internal):
    """``ai.agent.tool.control.refused``: policy ignored a control event it could not trust.

    Emitted for an unsigned, forged, expired or misbound decision or cancel; the call
    it named is unchanged. Audit records it as a failure (``permission_denied``).
    """

    invocation_id: UUID
    tenant_id: str
    control_type: str
    """``type`` of the refused control event."""
    actor: str = ""
    """Who the refused event claimed decided (unverified, for the audit trail)."""
    reason: str
    """Which check failed; never quotes the signature."""
    refused_event_id: str
    """``id`` of the refused control event."""


class OutcomeRefusalKind(StrEnum):
    """Why a reader ignored an outcome (a bounded metric label too)."""

    UNSIGNED = "unsigned"
    """No signature at all."""
    FORGED = "forged"
    """A signature that does not verify: unknown key, another key, malformed, expired."""
    MISBOUND = "misbound"
    """A valid signature issued for another call, tenant, type, status or body."""


class OutcomeRefused(_Internal):
    """``ai.agent.tool.outcome.refused``: a reader ignored an outcome it could not trust.

    Emitted by status and by policy (for an outcome duplicates waited on) for an
    unsigned or forged outcome, or one signed for another call; the call it named is
    unchanged. Audit records it as a failure (``permission_denied``).
    """

    invocation_id: str = Field(max_length=256)
    """The invocation the refused outcome named (unverified; not always a UUID)."""
    tenant_id: str = Field(max_length=128)
    """The tenant the refused outcome named (unverified)."""
    outcome_type: str
    """``type`` of the refused outcome event."""
    claimed_status: str = ""
    """The status the refused outcome claimed."""
    actor: str = ""
    """``source`` of the refused outcome (unverified, for the audit trail)."""
    refusal: OutcomeRefusalKind
    """Which kind of check failed."""
    reason: str
    """Which check failed; never quotes the signature."""
    refused_event_id: str
    """``id`` of the refused outcome event."""
    refused_by: str
    """The reader that refused it (``status``, ``policy``)."""


# --- audit and DLQ -----------------------------------------------------------------


class SourceEventRef(_Internal):
    source: str
    id: str
    type: str
    topic: str


class AuditRecord(_Internal):
    """``data`` of an event on ``toolfleet.audit``: PII-safe, never a token or secret."""

    audit_id: str
    event_type: str
    occurred_at: datetime
    tenant_id: str | None
    invocation_id: str | None
    agent_did: str | None = None
    user_did: str | None = None
    tool_id: str | None = None
    tool_version: str | None = None
    action: str
    """What happened, e.g. ``invoke.requested``, ``tool.succeeded``."""
    outcome: Literal["success", "failure", "pending", "info"]
    status: str | None = None
    error_code: str | None = None
    actor: str | None = None
    """Who caused it: the agent, or the approver/canceller for control events."""
    auth: dict[str, str] = Field(default_factory=dict)
    """``authtype``/``authid`` once policy verified the token."""
    parameters: dict[str, Any] | None = None
    """Parameters with secrets and PII patterns masked."""
    trace_id: str | None = None
    source_event: SourceEventRef
    ocsf: dict[str, Any]
    """OCSF 1.8 API Activity (class 6003) projection of the same fact."""


class AnomalyDetected(_Internal):
    """``data`` of ``ai.agent.tool.anomaly`` on ``toolfleet.audit``: a detector's finding."""

    anomaly_id: str
    """Deterministic per rule, subject and window: a replay re-emits the same id."""
    kind: Literal["denial_spike", "error_rate_jump", "novel_tools"]
    """Which rule fired."""
    tenant_id: str
    agent_did: str | None = None
    """The agent concerned (``denial_spike``, ``novel_tools``)."""
    tool_id: str | None = None
    """The tool concerned (``error_rate_jump``)."""
    window_start: datetime
    window_end: datetime
    observed: float
    """The value that crossed the threshold (a count, or an error rate)."""
    threshold: float
    baseline: float | None = None
    """What the value is compared with, where the rule has one (the hour's error rate)."""
    summary: str
    detected_at: datetime
    ocsf: dict[str, Any]
    """OCSF 1.8 Detection Finding (class 2004) projection of the same finding."""


class DlqHeader(_Internal):
    key: str
    value_b64: str


class DlqRecord(_Internal):
    """``data`` of an event on ``toolfleet.dlq``: everything needed to replay the input."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None = None
    key_b64: str | None = None
    headers: list[DlqHeader]
    value_b64: str
    consumer_group: str
    error: ErrorInfo
    failed_at: datetime
