"""How lifecycle events fold into one ``tool_invocations`` row. Pure: no I/O.

Events of one invocation arrive on six topics, so in any order and sometimes twice.
Every rule here is a merge that does not care about order, which is what makes the
projection converge: any ordering of one lifecycle's events gives the same row.

* **status** only moves up the rank ``pending 0 < pending_approval 1 < queued 1 <
  running 2 < terminal 3`` (``queued``, authorized and waiting for an executor of its
  pool, comes after ``pending_approval`` in the fold and shares its stored rank); the
  first terminal outcome wins and is never replaced. Checkpoints and ``executed``
  imply ``running`` (they only happen once the tool runs).
* **execution_metadata.pool**: the pool of a call that was queued, or of a tool outside
  the default pool, kept once known (the terminal outcome's metadata gets it too).
* **identity** (tenant, agent, user, session, tool, requested version, parameters,
  trace, priority, idempotency key): the first write wins. Every event only fills
  what is still unknown (a priority still at its default counts as unknown), so a
  later request that reuses the id (refused by policy with ``invocation_id_conflict``)
  never rewrites what the row shows an approver.
* **a row is a call**, ``(tenant_id, invocation_id)``: another tenant's events go to
  that tenant's own row (an event that names no tenant is not projected). So a request
  of tenant A that names tenant B's id makes A's row, and the ``invocation_id_conflict``
  refusal policy sends A ends it; B's row never sees either.
* an ``invocation_id_conflict`` outcome ends only a row that nothing policy accepted
  has reached (its request, control events): A's row above. On a row of an accepted
  call (the same tenant's later request under the id was refused, not the call) it
  changes nothing, and where it came first (the topics are read apart) any event of
  the accepted call replaces it: the row then folds as if it never came. It sets no
  phase, and fixes nothing of the row's identity but a new row's ``tool_id``.
* **current_phase** keeps the latest phase of the lifecycle, by this precedence:
  ``"" < awaiting_approval < approved < denied < authorized < queued < running <`` checkpoint
  phase ``< validating < cancel_requested < completed``; among checkpoints the one with
  the highest (progress, timestamp, id) wins, and is also ``latest_checkpoint``.
* **progress_percent** and **latest_checkpoint** only go up; ``created_at`` and
  ``started_at`` are the earliest seen; ``result``, ``error``, ``warnings``,
  ``execution_metadata`` and ``completed_at`` come from the terminal outcome
  (``warnings`` from ``invoke.authorized`` until then).

Control events (cancel, approval granted/denied) only set a phase, and only on an
existing row. Events that name no invocation (circuit changes) are not projected.
Inbound events that do not validate (``invoke.requested``, control) are skipped: policy
owns reporting them. An internal event that does not validate raises
:class:`~toolfleet.errors.InvalidEvent` (a version skew worth a DLQ record).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, Final, TypeVar

from toolfleet.errors import ErrorCode, InvalidEvent
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import (
    invocation_id_of,
    invocation_uuid,
    is_canonical_uuid,
    tenant_of,
    trace_id_of,
)
from toolfleet.events.masking import mask_parameters
from toolfleet.events.models import (
    ApprovalDecision,
    ApprovalRequested,
    CancelRequested,
    CheckpointCreated,
    InvocationStatus,
    InvokeAuthorized,
    InvokeExecuted,
    InvokeQueued,
    InvokeRequested,
    ToolInvoked,
    ToolOutcome,
)
from toolfleet.events.types import DEFAULT_POOL, TERMINAL_TYPES, EventType
from toolfleet.storage.pg_text import jsonable

_RANK: Final = {
    InvocationStatus.PENDING: 0,
    InvocationStatus.PENDING_APPROVAL: 1,
    InvocationStatus.QUEUED: 1,
    InvocationStatus.RUNNING: 2,
}
TERMINAL_RANK: Final = 3
_TERMINAL_STATUSES: Final = frozenset(s for s in InvocationStatus if s.is_terminal)

PHASE_COMPLETED: Final = "completed"
_CHECKPOINT_LEVEL: Final = 50
#: Precedence of the phases toolfleet itself sets (checkpoint phases sit at 50).
_PHASE_LEVEL: Final = {
    "": 0,
    "awaiting_approval": 10,
    "approved": 20,
    "denied": 25,
    "authorized": 30,
    "queued": 35,
    "running": 40,
    "validating": 60,
    "cancel_requested": 70,
    PHASE_COMPLETED: 100,
}


def status_rank(status: InvocationStatus) -> int:
    """The ``status_rank`` column: how far along the lifecycle a status is."""
    return TERMINAL_RANK if status.is_terminal else _RANK[status]


class Kind(StrEnum):
    """What an event says about an invocation."""

    REQUESTED = "requested"
    AUTHORIZED = "authorized"
    QUEUED = "queued"
    APPROVAL_REQUESTED = "approval_requested"
    INVOKED = "invoked"
    CHECKPOINT = "checkpoint"
    EXECUTED = "executed"
    TERMINAL = "terminal"
    CANCEL_REQUESTED = "cancel_requested"
    APPROVAL_GRANTED = "approval_granted"
    APPROVAL_DENIED = "approval_denied"


_OPTIONS_OWNERS: Final = frozenset({Kind.REQUESTED, Kind.AUTHORIZED})
"""Both carry the caller's ``execution_options`` verbatim."""
_DEFAULT_PRIORITY: Final = "normal"
_CONTROL: Final = frozenset({Kind.CANCEL_REQUESTED, Kind.APPROVAL_GRANTED, Kind.APPROVAL_DENIED})
_STATUS_OF_KIND: Final = {
    Kind.REQUESTED: InvocationStatus.PENDING,
    Kind.AUTHORIZED: InvocationStatus.PENDING,
    Kind.APPROVAL_REQUESTED: InvocationStatus.PENDING_APPROVAL,
    Kind.QUEUED: InvocationStatus.QUEUED,
    Kind.INVOKED: InvocationStatus.RUNNING,
    Kind.CHECKPOINT: InvocationStatus.RUNNING,
    Kind.EXECUTED: InvocationStatus.RUNNING,
}
_PHASE_OF_KIND: Final = {
    Kind.AUTHORIZED: "authorized",
    Kind.QUEUED: "queued",
    Kind.APPROVAL_REQUESTED: "awaiting_approval",
    Kind.INVOKED: "running",
    Kind.EXECUTED: "validating",
    Kind.TERMINAL: PHASE_COMPLETED,
    Kind.CANCEL_REQUESTED: "cancel_requested",
    Kind.APPROVAL_GRANTED: "approved",
    Kind.APPROVAL_DENIED: "denied",
}


@dataclass(frozen=True, kw_only=True)
class LatestCheckpoint:
    """``latest_checkpoint`` of a row."""

    checkpoint_id: str
    checkpoint_type: str
    progress_percent: float
    current_phase: str
    timestamp: datetime

    @property
    def order(self) -> tuple[float, datetime, str]:
        return (self.progress_percent, self.timestamp, self.checkpoint_id)

    @property
    def phase(self) -> str:
        """The phase this checkpoint reports; a checkpoint without one means running."""
        return self.current_phase or "running"

    def to_json(self) -> dict[str, Any]:
        return {
            "checkpoint_id": self.checkpoint_id,
            "checkpoint_type": self.checkpoint_type,
            "progress_percent": self.progress_percent,
            "current_phase": self.current_phase,
            "timestamp": self.timestamp.isoformat(),
        }

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> LatestCheckpoint:
        return cls(
            checkpoint_id=str(value["checkpoint_id"]),
            checkpoint_type=str(value.get("checkpoint_type", "micro")),
            progress_percent=float(value.get("progress_percent", 0)),
            current_phase=str(value.get("current_phase", "")),
            timestamp=datetime.fromisoformat(str(value["timestamp"])),
        )


@dataclass(frozen=True, kw_only=True)
class InvocationRow:
    """One ``tool_invocations`` row (``status_rank`` and ``updated_at`` are derived)."""

    invocation_id: str
    tenant_id: str
    tool_id: str
    created_at: datetime
    status: InvocationStatus = InvocationStatus.PENDING
    agent_did: str | None = None
    user_did: str | None = None
    session_id: str | None = None
    requested_version: str | None = None
    tool_version: str | None = None
    current_phase: str = ""
    progress_percent: float = 0.0
    parameters: dict[str, Any] | None = None
    parameters_hash: str | None = None
    """The hash an approval binds to, once policy parked the call for one."""
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    warnings: tuple[str, ...] = ()
    latest_checkpoint: LatestCheckpoint | None = None
    execution_metadata: dict[str, Any] | None = None
    documents_accessed: tuple[dict[str, Any], ...] = ()
    """The terminal outcome's ``documents_accessed``."""
    idempotency_key: str | None = None
    priority: str = "normal"
    trace_id: str | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None

    @property
    def status_rank(self) -> int:
        return status_rank(self.status)


@dataclass(frozen=True, kw_only=True)
class Fact:
    """What one lifecycle event says about one invocation (absent fields: ``None``)."""

    kind: Kind
    invocation_id: str
    tenant_id: str
    occurred_at: datetime
    tool_id: str | None = None
    agent_did: str | None = None
    user_did: str | None = None
    session_id: str | None = None
    requested_version: str | None = None
    tool_version: str | None = None
    priority: str | None = None
    idempotency_key: str | None = None
    parameters: dict[str, Any] | None = None
    parameters_hash: str | None = None
    trace_id: str | None = None
    warnings: tuple[str, ...] | None = None
    status: InvocationStatus | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    execution_metadata: dict[str, Any] | None = None
    documents_accessed: tuple[dict[str, Any], ...] = ()
    started_at: datetime | None = None
    completed_at: datetime | None = None
    checkpoint: LatestCheckpoint | None = None
    attempt: int | None = None
    """``invoked``: which execution attempt started."""
    worker_id: str | None = None
    """``invoked``: the executor that started it (a new one is a hand-over)."""
    resumed_from_checkpoint_id: str | None = None
    """``invoked``: the checkpoint the attempt resumed from, if it resumed."""
    id_conflict: bool = False
    """``terminal``: policy's ``invocation_id_conflict`` refusal of a request."""
    pool: str | None = None
    """``queued``: the executor pool of the call; ``authorized``: its pool, unless it is
    ``default`` (a call that never waited shows no pool)."""
    queue_reason: str | None = None
    """``queued``: why it waits (``no_live_executor``, ``tool_not_loaded``)."""

    def timeline_detail(self) -> dict[str, Any]:
        """What the console's timeline shows of this fact (no parameters, no result)."""
        detail: dict[str, Any] = {}
        if self.kind is Kind.QUEUED:
            detail = {"pool": self.pool, "reason": self.queue_reason, "worker_id": self.worker_id}
        elif self.kind is Kind.INVOKED:
            detail = {
                "attempt": self.attempt,
                "worker_id": self.worker_id,
                "resumed_from_checkpoint_id": self.resumed_from_checkpoint_id,
            }
        elif self.checkpoint is not None:
            detail = {
                "checkpoint_id": self.checkpoint.checkpoint_id,
                "checkpoint_type": self.checkpoint.checkpoint_type,
                "progress_percent": self.checkpoint.progress_percent,
                "current_phase": self.checkpoint.current_phase,
            }
        elif self.kind is Kind.TERMINAL:
            detail = {
                "status": self.status.value if self.status else None,
                "error_code": (self.error or {}).get("code"),
                "attempts": (self.execution_metadata or {}).get("attempts"),
            }
        elif self.tool_version is not None:
            detail = {"tool_version": self.tool_version}
            if self.kind is Kind.AUTHORIZED and self.pool is not None:
                detail["pool"] = self.pool
        return {k: v for k, v in detail.items() if v is not None}


# --- event -> fact -------------------------------------------------------------------
#
# One reader per event type: the event's pydantic model validates ``data`` (so bad input
# gives ``None`` or :class:`InvalidEvent` as the model decides) and the fact is built
# from the model, once.


def fact_of(event: Envelope, *, now: datetime) -> Fact | None:
    """The fact an event states, or ``None`` when it is not about one invocation."""
    reader = _READERS.get(event.type)
    if reader is None:
        return None
    raw = event.data.get("invocation_id")
    if is_canonical_uuid(raw):
        invocation_id: str | None = raw  # what invocation_id_of returns for it, cheaper
    else:
        invocation_id = invocation_id_of(event)
        if invocation_id is None:
            return None
    tenant_id = event.tenantid or tenant_of(event)
    if tenant_id is None:
        return None  # a row is a (tenant, invocation id): this event names no call
    base = {
        "invocation_id": invocation_id,
        "tenant_id": tenant_id,
        "occurred_at": event.time or now,
        "trace_id": trace_id_of(event.traceparent),
    }
    return reader(event, base)


def _requested(event: Envelope, base: dict[str, Any]) -> Fact | None:
    try:
        req = event.data_as(InvokeRequested)
    except InvalidEvent:
        return None  # policy dead-letters or fails it; its outcome will create the row
    ctx = req.agent_context
    if event.tenantid is not None and event.tenantid != ctx.tenant_id:
        return None  # policy refuses it; its outcome names the invocation
    raw = event.data.get("invocation_id")
    if is_canonical_uuid(raw):
        invocation_id = raw  # str(req.invocation_id), cheaper
    else:
        invocation_id = (
            str(req.invocation_id)
            if req.invocation_id
            else invocation_uuid(event.id, tenant_id=ctx.tenant_id)
        )
    attribute = event.invocationid
    if (
        attribute is not None
        and attribute != invocation_id
        and invocation_uuid(attribute, tenant_id=ctx.tenant_id) != invocation_id
    ):
        return None  # as policy: the attribute and the body disagree
    opts = req.execution_options
    return _fact(
        Kind.REQUESTED,
        base,
        tenant_id=ctx.tenant_id,
        invocation_id=invocation_id,
        tool_id=req.tool_id,
        agent_did=ctx.agent_did,
        user_did=ctx.user_did,
        session_id=ctx.session_id,
        requested_version=req.tool_version,
        priority=str(opts.priority),
        idempotency_key=opts.idempotency_key,
        parameters=mask_parameters(req.parameters),
    )


def _control(kind: Kind, model: type[CancelRequested | ApprovalDecision]) -> _Reader:
    def read(event: Envelope, base: dict[str, Any]) -> Fact | None:
        try:
            control = event.data_as(model)
        except InvalidEvent:
            return None  # policy dead-letters it
        if event.tenantid is not None and event.tenantid != control.tenant_id:
            return None
        return _fact(kind, base, tenant_id=control.tenant_id)

    return read


def _authorized(event: Envelope, base: dict[str, Any]) -> Fact:
    auth = event.data_as(InvokeAuthorized)
    ctx = auth.agent_context
    opts = auth.execution_options
    return _fact(
        Kind.AUTHORIZED,
        base,
        tool_id=auth.tool_id,
        agent_did=ctx.agent_did,
        user_did=ctx.user_did,
        session_id=ctx.session_id,
        requested_version=auth.requested_version,
        tool_version=auth.tool_version,
        priority=str(opts.priority),
        idempotency_key=opts.idempotency_key,
        parameters=mask_parameters(auth.parameters),
        warnings=tuple(auth.warnings),
        pool=None if auth.pool == DEFAULT_POOL else auth.pool,
    )


def _queued(event: Envelope, base: dict[str, Any]) -> Fact:
    queued = event.data_as(InvokeQueued)
    return _fact(
        Kind.QUEUED,
        base,
        tool_id=queued.tool_id,
        agent_did=queued.agent_did,
        tool_version=queued.tool_version,
        pool=queued.pool,
        queue_reason=queued.reason,
        worker_id=queued.worker_id,
    )


def _approval_requested(event: Envelope, base: dict[str, Any]) -> Fact:
    approval = event.data_as(ApprovalRequested)
    return _fact(
        Kind.APPROVAL_REQUESTED,
        base,
        tool_id=approval.tool_id,
        agent_did=approval.agent_did,
        tool_version=approval.tool_version,
        parameters_hash=approval.parameters_hash,
    )


def _invoked(event: Envelope, base: dict[str, Any]) -> Fact:
    invoked = event.data_as(ToolInvoked)
    return _fact(
        Kind.INVOKED,
        base,
        tool_id=invoked.tool_id,
        agent_did=invoked.agent_did,
        tool_version=invoked.tool_version,
        started_at=invoked.started_at,
        attempt=invoked.attempt,
        worker_id=invoked.worker_id,
        resumed_from_checkpoint_id=invoked.resumed_from_checkpoint_id,
    )


def _checkpoint(event: Envelope, base: dict[str, Any]) -> Fact:
    cp = event.data_as(CheckpointCreated)
    checkpoint = _new(
        LatestCheckpoint,
        {
            "checkpoint_id": cp.checkpoint_id,
            "checkpoint_type": cp.checkpoint_type,
            "progress_percent": cp.progress_percent,
            "current_phase": cp.current_phase,
            "timestamp": cp.timestamp,
        },
    )
    return _fact(Kind.CHECKPOINT, base, tool_id=cp.tool_id, checkpoint=checkpoint)


def _executed(event: Envelope, base: dict[str, Any]) -> Fact:
    executed = event.data_as(InvokeExecuted)
    return _fact(
        Kind.EXECUTED,
        base,
        tool_id=executed.tool_id,
        agent_did=executed.agent_context.agent_did,
        tool_version=executed.tool_version,
    )


def _terminal(event: Envelope, base: dict[str, Any]) -> Fact | None:
    outcome = event.data_as(ToolOutcome)
    if not outcome.status.is_terminal:
        raise InvalidEvent(f"{event.type} carries the non-terminal status {outcome.status}")
    meta = outcome.execution_metadata
    # One serializer pass for the three members the row keeps as JSON.
    dumped = jsonable(outcome, include=_TERMINAL_JSON)
    fact = _fact(
        Kind.TERMINAL,
        base,
        tool_id=outcome.tool_id,
        agent_did=outcome.agent_did,
        tool_version=outcome.tool_version,
        status=outcome.status,
        result=outcome.result,
        error=dumped["error"],
        execution_metadata=dumped["execution_metadata"],
        documents_accessed=tuple(dumped["documents_accessed"]),
        warnings=tuple(outcome.warnings),
        started_at=meta.started_at,
        completed_at=meta.completed_at,
    )
    if outcome.error is not None and outcome.error.code is ErrorCode.INVOCATION_ID_CONFLICT:
        # The refusal of another request under the id: it fixes nothing of a row (only
        # ``tool_id``, which a new row needs, and which an accepted event replaces).
        fact.__dict__.update(_CONFLICT_FIXES_NOTHING)
    return fact


_CONFLICT_FIXES_NOTHING: Final = {
    "id_conflict": True,
    "agent_did": None,
    "tool_version": None,
    "trace_id": None,
    "started_at": None,
}


_TERMINAL_JSON: Final = {"error", "execution_metadata", "documents_accessed"}


def _fact(kind: Kind, base: dict[str, Any], **values: Any) -> Fact:
    return _new(Fact, {**_FACT_DEFAULTS, "kind": kind, **base, **values})


_D = TypeVar("_D")


def _new(cls: type[_D], values: dict[str, Any]) -> _D:
    """``cls(**values)`` for a frozen dataclass, without its ``__init__``.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``,
    the single largest cost of folding an event once pydantic has validated it; these
    classes have no ``__post_init__`` and ``values`` names every field, so the instance
    is the same.
    """
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


_Reader = Callable[[Envelope, dict[str, Any]], "Fact | None"]
_READERS: Final[dict[str, _Reader]] = {
    EventType.INVOKE_REQUESTED: _requested,
    EventType.INVOKE_AUTHORIZED: _authorized,
    EventType.INVOKE_QUEUED: _queued,
    EventType.APPROVAL_REQUESTED: _approval_requested,
    EventType.INVOKED: _invoked,
    EventType.CHECKPOINT_CREATED: _checkpoint,
    EventType.INVOKE_EXECUTED: _executed,
    **dict.fromkeys(TERMINAL_TYPES, _terminal),
    EventType.CANCEL_REQUESTED: _control(Kind.CANCEL_REQUESTED, CancelRequested),
    EventType.APPROVAL_GRANTED: _control(Kind.APPROVAL_GRANTED, ApprovalDecision),
    EventType.APPROVAL_DENIED: _control(Kind.APPROVAL_DENIED, ApprovalDecision),
}
"""The reader of each event type that names an invocation."""


# --- fact -> row ---------------------------------------------------------------------


def apply(row: InvocationRow | None, fact: Fact) -> InvocationRow | None:
    """The row after ``fact``; ``None`` when there is no row and the fact makes none.

    Returns ``row`` itself (unchanged) for an event of another tenant.
    """
    kind = fact.kind
    if row is None:
        if kind in _CONTROL or not fact.tool_id or not fact.tenant_id:
            return None
        values = {
            **_ROW_DEFAULTS,
            "invocation_id": fact.invocation_id,
            "tenant_id": fact.tenant_id,
            "tool_id": fact.tool_id,
            "created_at": fact.occurred_at,
        }
    elif fact.tenant_id != row.tenant_id:
        return row  # another call's (the store keys rows by the pair: never happens there)
    elif fact.id_conflict and _accepted(row):
        return row  # the refusal of a later request under this call's id: not the call's
    else:
        values = dict(row.__dict__)
        if kind in _ACCEPTED_KINDS and not fact.id_conflict and _refused_as_conflict(row):
            # The call was accepted after all: the conflict refusal was another request's.
            values.update(_UNENDED)
            values["tool_id"] = fact.tool_id or row.tool_id
    # Every merge below edits ``values``; the row is built once, at the end.
    _merge_identity(values, fact, kind)
    _merge_progress(values, fact, kind)
    _merge_status(values, fact, kind)
    _merge_pool(values, fact, kind)
    if not fact.id_conflict:  # a refusal that an accepted event may replace sets no phase
        _merge_phase(values, kind)
    return _new(InvocationRow, values)


_ACCEPTED_KINDS: Final = frozenset(
    {
        Kind.AUTHORIZED,
        Kind.QUEUED,
        Kind.APPROVAL_REQUESTED,
        Kind.INVOKED,
        Kind.CHECKPOINT,
        Kind.EXECUTED,
        Kind.TERMINAL,
    }
)
"""What policy (or a stage after it) says of a call it accepted, or a non-conflict
refusal: never a request's own event, nor a tenant's control event."""
_UNENDED: Final = {
    "status": InvocationStatus.PENDING,
    "result": None,
    "error": None,
    "warnings": (),
    "execution_metadata": None,
    "documents_accessed": (),
    "completed_at": None,
}
"""A row's terminal fields before any outcome."""


def _refused_as_conflict(row: InvocationRow) -> bool:
    """The row ended with an ``invocation_id_conflict`` refusal."""
    error = row.error
    return (
        row.status is InvocationStatus.ERROR
        and error is not None
        and error.get("code") == ErrorCode.INVOCATION_ID_CONFLICT
    )


def _accepted(row: InvocationRow) -> bool:
    """An event of :data:`_ACCEPTED_KINDS` reached the row: it is a call policy took
    (authorized and approval events resolve ``tool_version``; a conflict refusal and a
    request never do), or one it refused otherwise."""
    if _refused_as_conflict(row):
        return False
    return row.status is not InvocationStatus.PENDING or row.tool_version is not None


def _merge_identity(row: dict[str, Any], fact: Fact, kind: Kind) -> None:
    # Fill what is unknown; never overwrite what an earlier event established.
    for name in _FILLED_BY_ANY:
        if row[name] is None:
            row[name] = getattr(fact, name)
    if kind in _OPTIONS_OWNERS:
        # Filled too: the default priority is the only value a later one may replace.
        if row["priority"] == _DEFAULT_PRIORITY and fact.priority:
            row["priority"] = fact.priority
        if row["idempotency_key"] is None:
            row["idempotency_key"] = fact.idempotency_key
    if row["tool_version"] is None:
        row["tool_version"] = fact.tool_version
    if row["parameters_hash"] is None:
        row["parameters_hash"] = fact.parameters_hash
    if fact.occurred_at < row["created_at"]:
        row["created_at"] = fact.occurred_at
    started_at = fact.started_at
    if started_at is not None and (row["started_at"] is None or started_at < row["started_at"]):
        row["started_at"] = started_at


_FILLED_BY_ANY: Final = (
    "agent_did",
    "user_did",
    "session_id",
    "requested_version",
    "parameters",
    "trace_id",
)


def _merge_progress(row: dict[str, Any], fact: Fact, kind: Kind) -> None:
    checkpoint = row["latest_checkpoint"]
    if fact.checkpoint is not None and (
        checkpoint is None or fact.checkpoint.order > checkpoint.order
    ):
        checkpoint = fact.checkpoint
    progress = max(row["progress_percent"], checkpoint.progress_percent if checkpoint else 0.0)
    if kind is Kind.TERMINAL and fact.status is InvocationStatus.SUCCESS:
        progress = 100.0
    row["latest_checkpoint"] = checkpoint
    row["progress_percent"] = progress


def _merge_status(row: dict[str, Any], fact: Fact, kind: Kind) -> None:
    status = row["status"]
    if status in _TERMINAL_STATUSES:
        return  # the first terminal outcome is final
    if kind is Kind.TERMINAL and fact.status is not None and fact.status in _TERMINAL_STATUSES:
        pool = (row["execution_metadata"] or {}).get("pool")
        row["status"] = fact.status
        row["result"] = fact.result
        row["error"] = fact.error
        row["warnings"] = fact.warnings or ()
        row["execution_metadata"] = fact.execution_metadata
        if pool is not None:
            _keep_pool(row, pool)
        row["documents_accessed"] = fact.documents_accessed
        row["completed_at"] = fact.completed_at or fact.occurred_at
        return
    if kind is Kind.AUTHORIZED and fact.warnings is not None:
        row["warnings"] = fact.warnings
    new = _STATUS_OF_KIND.get(kind)
    if new is not None and _STATUS_RANK[new] > _STATUS_RANK[status]:
        row["status"] = new


def _merge_pool(row: dict[str, Any], fact: Fact, kind: Kind) -> None:
    """The call's pool, once known: from a queued fact, or the authorized one of a tool
    outside the default pool (a default-pool call that never waited shows none)."""
    if fact.pool is not None:
        _keep_pool(row, fact.pool)


def _keep_pool(row: dict[str, Any], pool: str) -> None:
    meta = row["execution_metadata"]
    if meta is None:
        row["execution_metadata"] = {"pool": pool}
    elif "pool" not in meta:
        row["execution_metadata"] = {**meta, "pool": pool}


def _merge_phase(row: dict[str, Any], kind: Kind) -> None:
    level = _PHASE_LEVEL.get(row["current_phase"], _CHECKPOINT_LEVEL)
    if kind is Kind.CHECKPOINT:
        # The checkpoint phase is recomputed from the winning checkpoint, not this one.
        if level <= _CHECKPOINT_LEVEL and row["latest_checkpoint"] is not None:
            row["current_phase"] = row["latest_checkpoint"].phase
        return
    phase = _PHASE_OF_KIND.get(kind)
    if phase is not None and _PHASE_LEVEL[phase] >= level:
        row["current_phase"] = phase


_ROW_DEFAULTS: Final = {
    f.name: f.default for f in fields(InvocationRow) if f.default is not MISSING
}
_FACT_DEFAULTS: Final = {f.name: f.default for f in fields(Fact) if f.default is not MISSING}
_STATUS_RANK: Final = {
    # ``queued`` follows ``pending_approval`` (approved, then waiting for an executor).
    status: (status_rank(status), status is InvocationStatus.QUEUED)
    for status in InvocationStatus
}
