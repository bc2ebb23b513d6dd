"""The status projection as it was before its fast path (services/toolfleet/status/projection.py
at 3669a25), kept verbatim as the oracle of ``tests/unit/test_status_projection_golden.py``.

Do not optimize or fix this copy: the golden test proves the live module folds every event
sequence into the same row, and raises or skips the same bad events, as this one does.

The original docstring follows.

How lifecycle events fold into one ``tool_invocations`` row. Pure: no I/O.

Events of one invocation arrive on six topics, so in any order and sometimes twice.
Every rule here is a merge that does not care about order, which is what makes the
projection converge: any ordering of one lifecycle's events gives the same row.

* **status** only moves up the rank ``pending 0 < pending_approval 1 < running 2 <
  terminal 3``; the first terminal outcome wins and is never replaced. Checkpoints and
  ``executed`` imply ``running`` (they only happen once the tool runs).
* **identity** (tenant, agent, user, session, tool, requested version, priority,
  idempotency key, parameters, trace): ``invoke.requested`` is authoritative and
  overwrites; every other event only fills what is still unknown. Another tenant's
  event never touches a row.
* **current_phase** keeps the latest phase of the lifecycle, by this precedence:
  ``"" < awaiting_approval < approved < denied < authorized < running <`` checkpoint
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

from dataclasses import dataclass, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Final, TypeVar

from toolfleet.errors import InvalidEvent
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import invocation_id_of, invocation_uuid, tenant_of, trace_id_of
from toolfleet.events.models import (
    ApprovalDecision,
    ApprovalRequested,
    CancelRequested,
    CheckpointCreated,
    InvocationStatus,
    InvokeAuthorized,
    InvokeExecuted,
    InvokeRequested,
    ToolInvoked,
    ToolOutcome,
)
from toolfleet.events.sanitize import sanitize_parameters
from toolfleet.events.types import TERMINAL_TYPES, EventType

_RANK: Final = {
    InvocationStatus.PENDING: 0,
    InvocationStatus.PENDING_APPROVAL: 1,
    InvocationStatus.RUNNING: 2,
}
TERMINAL_RANK: Final = 3

PHASE_COMPLETED: Final = "completed"
_CHECKPOINT_LEVEL: Final = 50
#: Precedence of the phases toolfleet itself sets (checkpoint phases sit at 50).
_PHASE_LEVEL: Final = {
    "": 0,
    "awaiting_approval": 10,
    "approved": 20,
    "denied": 25,
    "authorized": 30,
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
    APPROVAL_REQUESTED = "approval_requested"
    INVOKED = "invoked"
    CHECKPOINT = "checkpoint"
    EXECUTED = "executed"
    TERMINAL = "terminal"
    CANCEL_REQUESTED = "cancel_requested"
    APPROVAL_GRANTED = "approval_granted"
    APPROVAL_DENIED = "approval_denied"


_T = TypeVar("_T")
_OPTIONS_OWNERS: Final = frozenset({Kind.REQUESTED, Kind.AUTHORIZED})
"""Both carry the caller's ``execution_options`` verbatim."""
_CONTROL: Final = frozenset({Kind.CANCEL_REQUESTED, Kind.APPROVAL_GRANTED, Kind.APPROVAL_DENIED})
_KIND_OF_TYPE: Final[dict[str, Kind]] = {
    EventType.INVOKE_REQUESTED: Kind.REQUESTED,
    EventType.INVOKE_AUTHORIZED: Kind.AUTHORIZED,
    EventType.APPROVAL_REQUESTED: Kind.APPROVAL_REQUESTED,
    EventType.INVOKED: Kind.INVOKED,
    EventType.CHECKPOINT_CREATED: Kind.CHECKPOINT,
    EventType.INVOKE_EXECUTED: Kind.EXECUTED,
    EventType.CANCEL_REQUESTED: Kind.CANCEL_REQUESTED,
    EventType.APPROVAL_GRANTED: Kind.APPROVAL_GRANTED,
    EventType.APPROVAL_DENIED: Kind.APPROVAL_DENIED,
}
_STATUS_OF_KIND: Final = {
    Kind.REQUESTED: InvocationStatus.PENDING,
    Kind.AUTHORIZED: InvocationStatus.PENDING,
    Kind.APPROVAL_REQUESTED: InvocationStatus.PENDING_APPROVAL,
    Kind.INVOKED: InvocationStatus.RUNNING,
    Kind.CHECKPOINT: InvocationStatus.RUNNING,
    Kind.EXECUTED: InvocationStatus.RUNNING,
}
_PHASE_OF_KIND: Final = {
    Kind.AUTHORIZED: "authorized",
    Kind.APPROVAL_REQUESTED: "awaiting_approval",
    Kind.INVOKED: "running",
    Kind.EXECUTED: "validating",
    Kind.TERMINAL: PHASE_COMPLETED,
    Kind.CANCEL_REQUESTED: "cancel_requested",
    Kind.APPROVAL_GRANTED: "approved",
    Kind.APPROVAL_DENIED: "denied",
}


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
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
    def from_json(cls, value: dict[str, Any]) -> Checkpoint:
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
    latest_checkpoint: Checkpoint | None = None
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
    tenant_id: str | None
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
    checkpoint: Checkpoint | None = None
    attempt: int | None = None
    """``invoked``: which execution attempt started."""
    worker_id: str | None = None
    """``invoked``: the executor that started it (a new one is a hand-over)."""
    resumed_from_checkpoint_id: str | None = None
    """``invoked``: the checkpoint the attempt resumed from, if it resumed."""

    def timeline_detail(self) -> dict[str, Any]:
        """What the console's timeline shows of this fact (no parameters, no result)."""
        detail: dict[str, Any] = {}
        if self.kind is Kind.INVOKED:
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
        return {k: v for k, v in detail.items() if v is not None}


# --- event -> fact -------------------------------------------------------------------


def fact_of(event: Envelope, *, now: datetime) -> Fact | None:
    """The fact an event states, or ``None`` when it is not about one invocation."""
    invocation_id = invocation_id_of(event)
    if invocation_id is None:
        return None
    base = {
        "invocation_id": invocation_id,
        "tenant_id": tenant_of(event),
        "occurred_at": event.time or now,
        "trace_id": trace_id_of(event.traceparent),
    }
    kind = _kind_of(event.type)
    if kind is None:
        return None
    if kind is Kind.REQUESTED:
        return _requested(event, base)
    if kind in _CONTROL:
        return _control(event, kind, base)
    return _internal(event, kind, base)


def _kind_of(event_type: str) -> Kind | None:
    if event_type in TERMINAL_TYPES:
        return Kind.TERMINAL
    return _KIND_OF_TYPE.get(event_type)


def _requested(event: Envelope, base: dict[str, Any]) -> Fact | None:
    try:
        req = event.data_as(InvokeRequested)
    except InvalidEvent:
        return None  # policy dead-letters or fails it; its outcome will create the row
    ctx = req.agent_context
    if event.tenantid is not None and event.tenantid != ctx.tenant_id:
        return None  # policy refuses it; its outcome names the invocation
    invocation_id = str(req.invocation_id) if req.invocation_id else invocation_uuid(event.id)
    if event.invocationid is not None and invocation_uuid(event.invocationid) != invocation_id:
        return None  # as policy: the attribute and the body disagree
    opts = req.execution_options
    return Fact(
        kind=Kind.REQUESTED,
        **{**base, "tenant_id": ctx.tenant_id, "invocation_id": invocation_id},
        tool_id=req.tool_id,
        agent_did=ctx.agent_did,
        user_did=ctx.user_did,
        session_id=ctx.session_id,
        requested_version=req.tool_version,
        priority=str(opts.priority),
        idempotency_key=opts.idempotency_key,
        parameters=sanitize_parameters(req.parameters),
    )


def _control(event: Envelope, kind: Kind, base: dict[str, Any]) -> Fact | None:
    control: CancelRequested | ApprovalDecision
    try:
        if kind is Kind.CANCEL_REQUESTED:
            control = event.data_as(CancelRequested)
        else:
            control = event.data_as(ApprovalDecision)
    except InvalidEvent:
        return None  # policy dead-letters it
    if event.tenantid is not None and event.tenantid != control.tenant_id:
        return None
    return Fact(kind=kind, **{**base, "tenant_id": control.tenant_id})


def _internal(event: Envelope, kind: Kind, base: dict[str, Any]) -> Fact:
    match kind:
        case Kind.AUTHORIZED:
            auth = event.data_as(InvokeAuthorized)
            ctx = auth.agent_context
            opts = auth.execution_options
            return Fact(
                kind=kind,
                **base,
                tool_id=auth.tool_id,
                agent_did=ctx.agent_did,
                user_did=ctx.user_did,
                session_id=ctx.session_id,
                requested_version=auth.requested_version,
                tool_version=auth.tool_version,
                priority=str(opts.priority),
                idempotency_key=opts.idempotency_key,
                parameters=sanitize_parameters(auth.parameters),
                warnings=tuple(auth.warnings),
            )
        case Kind.APPROVAL_REQUESTED:
            approval = event.data_as(ApprovalRequested)
            return Fact(
                kind=kind,
                **base,
                tool_id=approval.tool_id,
                agent_did=approval.agent_did,
                tool_version=approval.tool_version,
                parameters_hash=approval.parameters_hash,
            )
        case Kind.INVOKED:
            invoked = event.data_as(ToolInvoked)
            return Fact(
                kind=kind,
                **base,
                tool_id=invoked.tool_id,
                agent_did=invoked.agent_did,
                tool_version=invoked.tool_version,
                started_at=invoked.started_at,
                attempt=invoked.attempt,
                worker_id=invoked.worker_id,
                resumed_from_checkpoint_id=invoked.resumed_from_checkpoint_id,
            )
        case Kind.CHECKPOINT:
            cp = event.data_as(CheckpointCreated)
            checkpoint = Checkpoint(
                checkpoint_id=cp.checkpoint_id,
                checkpoint_type=cp.checkpoint_type,
                progress_percent=cp.progress_percent,
                current_phase=cp.current_phase,
                timestamp=cp.timestamp,
            )
            return Fact(kind=kind, **base, tool_id=cp.tool_id, checkpoint=checkpoint)
        case Kind.EXECUTED:
            executed = event.data_as(InvokeExecuted)
            return Fact(
                kind=kind,
                **base,
                tool_id=executed.tool_id,
                agent_did=executed.agent_context.agent_did,
                tool_version=executed.tool_version,
            )
        case _:
            return _terminal(event, base)


def _terminal(event: Envelope, base: dict[str, Any]) -> Fact:
    outcome = event.data_as(ToolOutcome)
    if not outcome.status.is_terminal:
        raise InvalidEvent(f"{event.type} carries the non-terminal status {outcome.status}")
    meta = outcome.execution_metadata
    return Fact(
        kind=Kind.TERMINAL,
        **{**base, "tenant_id": base["tenant_id"] or outcome.tenant_id},
        tool_id=outcome.tool_id,
        agent_did=outcome.agent_did,
        tool_version=outcome.tool_version,
        status=outcome.status,
        result=outcome.result,
        error=outcome.error.model_dump(mode="json") if outcome.error else None,
        execution_metadata=meta.model_dump(mode="json"),
        documents_accessed=tuple(d.model_dump(mode="json") for d in outcome.documents_accessed),
        warnings=tuple(outcome.warnings),
        started_at=meta.started_at,
        completed_at=meta.completed_at,
    )


# --- fact -> row ---------------------------------------------------------------------


def apply(row: InvocationRow | None, fact: Fact) -> InvocationRow | None:
    """The row after ``fact``; ``None`` when there is no row and the fact makes none.

    Returns ``row`` itself (unchanged) for an event of another tenant.
    """
    if row is None:
        if fact.kind in _CONTROL or not fact.tool_id or not fact.tenant_id:
            return None
        row = InvocationRow(
            invocation_id=fact.invocation_id,
            tenant_id=fact.tenant_id,
            tool_id=fact.tool_id,
            created_at=fact.occurred_at,
        )
    elif fact.tenant_id is not None and fact.tenant_id != row.tenant_id:
        return row
    row = _merge_identity(row, fact)
    row = _merge_progress(row, fact)
    row = _merge_status(row, fact)
    return _merge_phase(row, fact)


def _merge_identity(row: InvocationRow, fact: Fact) -> InvocationRow:
    if fact.kind is Kind.REQUESTED:
        row = replace(
            row,
            tool_id=fact.tool_id or row.tool_id,
            agent_did=fact.agent_did,
            user_did=fact.user_did,
            session_id=fact.session_id,
            requested_version=fact.requested_version,
            parameters=fact.parameters,
            trace_id=fact.trace_id or row.trace_id,
        )
    else:
        row = replace(
            row,
            agent_did=_fill(row.agent_did, fact.agent_did),
            user_did=_fill(row.user_did, fact.user_did),
            session_id=_fill(row.session_id, fact.session_id),
            requested_version=_fill(row.requested_version, fact.requested_version),
            parameters=_fill(row.parameters, fact.parameters),
            trace_id=_fill(row.trace_id, fact.trace_id),
        )
    if fact.kind in _OPTIONS_OWNERS:
        row = replace(
            row,
            priority=fact.priority or row.priority,
            idempotency_key=fact.idempotency_key,
        )
    return replace(
        row,
        tool_version=_fill(row.tool_version, fact.tool_version),
        parameters_hash=_fill(row.parameters_hash, fact.parameters_hash),
        created_at=min(row.created_at, fact.occurred_at),
        started_at=_earliest(row.started_at, fact.started_at),
    )


def _merge_progress(row: InvocationRow, fact: Fact) -> InvocationRow:
    checkpoint = row.latest_checkpoint
    if fact.checkpoint is not None and (
        checkpoint is None or fact.checkpoint.order > checkpoint.order
    ):
        checkpoint = fact.checkpoint
    progress = max(row.progress_percent, checkpoint.progress_percent if checkpoint else 0.0)
    if fact.kind is Kind.TERMINAL and fact.status is InvocationStatus.SUCCESS:
        progress = 100.0
    return replace(row, latest_checkpoint=checkpoint, progress_percent=progress)


def _merge_status(row: InvocationRow, fact: Fact) -> InvocationRow:
    if row.status.is_terminal:
        return row  # the first terminal outcome is final
    if fact.kind is Kind.TERMINAL and fact.status is not None and fact.status.is_terminal:
        return replace(
            row,
            status=fact.status,
            result=fact.result,
            error=fact.error,
            warnings=fact.warnings or (),
            execution_metadata=fact.execution_metadata,
            documents_accessed=fact.documents_accessed,
            completed_at=fact.completed_at or fact.occurred_at,
        )
    if fact.kind is Kind.AUTHORIZED and fact.warnings is not None:
        row = replace(row, warnings=fact.warnings)
    status = _STATUS_OF_KIND.get(fact.kind)
    if status is not None and status_rank(status) > row.status_rank:
        row = replace(row, status=status)
    return row


def _phase_level(row: InvocationRow) -> int:
    return _PHASE_LEVEL.get(row.current_phase, _CHECKPOINT_LEVEL)


def _merge_phase(row: InvocationRow, fact: Fact) -> InvocationRow:
    if fact.kind is Kind.CHECKPOINT:
        # The checkpoint phase is recomputed from the winning checkpoint, not this one.
        if _phase_level(row) <= _CHECKPOINT_LEVEL and row.latest_checkpoint is not None:
            return replace(row, current_phase=row.latest_checkpoint.phase)
        return row
    phase = _PHASE_OF_KIND.get(fact.kind)
    if phase is not None and _PHASE_LEVEL[phase] >= _phase_level(row):
        return replace(row, current_phase=phase)
    return row


def _fill(current: _T, new: _T) -> _T:
    """Fill what is unknown; never overwrite what an earlier event established."""
    return current if current is not None else new


def _earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    if a is None or b is None:
        return a or b
    return min(a, b)
