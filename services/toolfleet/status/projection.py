"""How lifecycle events fold into one ``tool_invocations`` row. Pure: no I/O.

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

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, Final, TypeVar

from pydantic import TypeAdapter

from toolfleet.errors import ErrorCode, InvalidEvent
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import invocation_id_of, invocation_uuid, tenant_of, trace_id_of
from toolfleet.events.models import (
    DOCUMENT_ID_PATTERN,
    MAX_PARAMETER_DEPTH,
    TENANT_ID_PATTERN,
    ApprovalDecision,
    ApprovalRequested,
    CancelRequested,
    CheckpointCreated,
    Effect,
    InvocationStatus,
    InvokeAuthorized,
    InvokeExecuted,
    InvokeRequested,
    Priority,
    ToolInvoked,
    ToolOutcome,
    nesting_depth_exceeds,
)
from toolfleet.events.sanitize import sanitize_parameters
from toolfleet.events.types import TERMINAL_TYPES, EventType

_RANK: Final = {
    InvocationStatus.PENDING: 0,
    InvocationStatus.PENDING_APPROVAL: 1,
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
#
# Each event goes to a fast reader first: it takes ``data`` as the plain dict it is and
# checks every member against the event's pydantic model by hand, but accepts only what
# it can vouch for (exact JSON types, ASCII where a length is bounded, datetimes in RFC
# 3339 UTC form). Anything else raises :class:`_Unsure` and the pydantic model decides,
# so bad input gets the very same ``None`` or :class:`InvalidEvent` as before; only the
# cost of the common, well-formed event changed. The fast reader must describe the
# models as they are: ``tests/unit/test_status_projection_golden.py`` compares both
# readers on damaged data and fails when one of the models changes.


def fact_of(event: Envelope, *, now: datetime) -> Fact | None:
    """The fact an event states, or ``None`` when it is not about one invocation."""
    reader = _READERS.get(event.type)
    if reader is None:
        return None
    data = event.data
    raw = data.get("invocation_id")
    if type(raw) is str and len(raw) == _UUID_LEN and _CANONICAL_UUID.fullmatch(raw):
        invocation_id: str | None = raw  # what invocation_id_of returns for it, cheaper
    else:
        invocation_id = invocation_id_of(event)
        if invocation_id is None:
            return None
    base = {
        "invocation_id": invocation_id,
        "tenant_id": event.tenantid or tenant_of(event),
        "occurred_at": event.time or now,
        "trace_id": _trace_id(event.traceparent),
    }
    fast, slow = reader
    try:
        return fast(event, data, base)
    except _Unsure:
        return slow(event, base)


def _trace_id(traceparent: str | None) -> str | None:
    """``trace_id_of(traceparent)``, without its parser for the usual version ``00``."""
    if traceparent is not None and len(traceparent) == _TRACEPARENT_00_LEN:
        match = _TRACEPARENT_00.fullmatch(traceparent)
        if match is not None:
            trace_id = match[1]
            return trace_id if trace_id != _ZERO_TRACE and match[2] != _ZERO_SPAN else None
    return trace_id_of(traceparent)


class _Unsure(Exception):
    """The fast reader met data it cannot vouch for: the pydantic model decides."""


_FastReader = Callable[[Envelope, dict[str, Any], dict[str, Any]], "Fact | None"]
_SlowReader = Callable[[Envelope, dict[str, Any]], "Fact | None"]

_UUID_LEN: Final = 36
_CANONICAL_UUID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ANY_CASE_UUID: Final = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
#: A version ``00`` traceparent as toolfleet writes it (anything else: ``trace_id_of``).
_TRACEPARENT_00: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_TRACEPARENT_00_LEN: Final = 55
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16
#: RFC 3339 in UTC, as pydantic and the codec write it; pydantic parses the rest.
_UTC_DATETIME: Final = re.compile(r"[1-9]\d{3}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?(?:Z|\+00:00)")
#: The ``tzinfo`` pydantic gives a UTC datetime, so fast and slow facts are alike.
_UTC: Final = TypeAdapter(datetime).validate_python("2000-01-01T00:00:00Z").tzinfo
_TENANT_ID: Final = re.compile(TENANT_ID_PATTERN.removeprefix("^").removesuffix("$"))
_DOCUMENT_ID: Final = re.compile(DOCUMENT_ID_PATTERN.removeprefix("^").removesuffix("$"))
_SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}")
_EXACT_FLOAT_INT: Final = 2**53
_PLAIN_DEPTH: Final = 32
_INT64: Final = 2**63

_PRIORITIES: Final = {p.value: p for p in Priority}
_EFFECTS: Final = {e.value: e for e in Effect}
_STATUSES: Final = {s.value: s for s in InvocationStatus}
_ERROR_CODES: Final = {c.value: c for c in ErrorCode}
_CHECKPOINT_TYPES: Final = frozenset({"micro", "macro", "named"})
_ACCESS_KINDS: Final = frozenset({"read", "metadata", "search"})

# The members each strict (``extra="forbid"``) model accepts.
_AGENT_CONTEXT_KEYS: Final = frozenset({"agent_did", "tenant_id", "user_did", "session_id"})
_RESOURCE_LIMITS_KEYS: Final = frozenset(
    {"cpu_millicore_limit", "memory_mb_limit", "timeout_seconds"}
)
_CHECKPOINT_CONFIG_KEYS: Final = frozenset(
    {"enable_checkpointing", "checkpoint_interval_seconds", "resume_from_checkpoint_id"}
)
_EXECUTION_OPTIONS_KEYS: Final = frozenset(
    {"async_mode", "priority", "idempotency_key", "require_approval"}
)
_DOCUMENT_CONTEXT_KEYS: Final = frozenset({"documents", "source"})
_DOCUMENT_REF_KEYS: Final = frozenset({"document_id", "version"})
_REQUESTED_KEYS: Final = frozenset(
    {
        "invocation_id",
        "tool_id",
        "tool_version",
        "agent_context",
        "parameters",
        "capability_token",
        "connection_id",
        "resource_limits",
        "checkpoint_config",
        "execution_options",
        "document_context",
    }
)
_CANCEL_KEYS: Final = frozenset(
    {"invocation_id", "tenant_id", "requested_by", "reason", "signature"}
)
_DECISION_KEYS: Final = frozenset(
    {"invocation_id", "tenant_id", "approver", "reason", "parameters_hash", "signature"}
)
_ERROR_INFO_KEYS: Final = frozenset({"code", "message", "details", "retryable", "retry_after_s"})


# Members: each returns the value pydantic would give, or raises _Unsure.
def _text(d: dict[str, Any], key: str, max_len: int | None = None, min_len: int = 0) -> str:
    value = d.get(key)
    if type(value) is not str:
        raise _Unsure
    if max_len is not None and not (min_len <= len(value) <= max_len and value.isascii()):
        raise _Unsure  # a lone surrogate's length is pydantic's business
    return value


def _text_or(d: dict[str, Any], key: str, default: str, max_len: int | None = None) -> str:
    return default if key not in d else _text(d, key, max_len)


def _opt_text(d: dict[str, Any], key: str, max_len: int | None = None) -> str | None:
    return None if d.get(key) is None else _text(d, key, max_len)


def _matching(d: dict[str, Any], key: str, pattern: re.Pattern[str]) -> str:
    value = d.get(key)
    if type(value) is not str or pattern.fullmatch(value) is None:
        raise _Unsure
    return value


def _int(d: dict[str, Any], key: str, default: int | None = None, ge: int | None = None) -> int:
    value = d.get(key, default)
    if type(value) is not int or (ge is not None and value < ge):
        raise _Unsure
    return value


def _opt_int(d: dict[str, Any], key: str, ge: int | None = None) -> int | None:
    return None if d.get(key) is None else _int(d, key, ge=ge)


def _number(value: Any) -> float:
    if type(value) is float:
        return value
    if type(value) is int and -_EXACT_FLOAT_INT <= value <= _EXACT_FLOAT_INT:
        return float(value)
    raise _Unsure


def _float(d: dict[str, Any], key: str, default: float | None = None) -> float:
    return _number(d.get(key, default))


def _opt_float(d: dict[str, Any], key: str) -> float | None:
    value = d.get(key)
    return None if value is None else _number(value)


def _bool(d: dict[str, Any], key: str, default: bool) -> bool:
    value = d.get(key, default)
    if type(value) is not bool:
        raise _Unsure
    return value


def _member(
    d: dict[str, Any], key: str, members: Mapping[str, _T], default: _T | None = None
) -> _T:
    if default is not None and key not in d:
        return default
    value = d.get(key)
    found = members.get(value) if type(value) is str else None
    if found is None:
        raise _Unsure
    return found


def _literal(d: dict[str, Any], key: str, allowed: frozenset[str], default: str) -> str:
    value = d.get(key, default)
    if type(value) is not str or value not in allowed:
        raise _Unsure
    return value


def _uuid(d: dict[str, Any], key: str) -> str:
    value = d.get(key)
    if type(value) is not str or len(value) != _UUID_LEN or not _ANY_CASE_UUID.fullmatch(value):
        raise _Unsure
    return value


def _datetime(value: Any) -> datetime:
    if type(value) is not str or _UTC_DATETIME.fullmatch(value) is None:
        raise _Unsure
    try:
        return datetime.fromisoformat(value).replace(tzinfo=_UTC)
    except ValueError:
        raise _Unsure from None


def _opt_datetime(d: dict[str, Any], key: str) -> datetime | None:
    value = d.get(key)
    return None if value is None else _datetime(value)


def _json_datetime(value: datetime | None) -> str | None:
    """A UTC datetime as ``model_dump(mode="json")`` writes it."""
    return None if value is None else value.isoformat().removesuffix("+00:00") + "Z"


def _dict(d: dict[str, Any], key: str, keys: frozenset[str] | None = None) -> dict[str, Any]:
    """A nested object; ``keys``: all it may have (a strict model)."""
    value = d.get(key)
    if type(value) is not dict or (keys is not None and not value.keys() <= keys):
        raise _Unsure
    return value


def _json_object(d: dict[str, Any], key: str) -> dict[str, Any]:
    """A ``dict[str, Any]`` member: pydantic's copy of it."""
    value = _dict(d, key)
    if not all(type(k) is str for k in value):
        raise _Unsure
    return dict(value)


def _list(d: dict[str, Any], key: str) -> list[Any]:
    value = d.get(key, [])
    if type(value) is not list:
        raise _Unsure
    return value


def _texts(d: dict[str, Any], key: str) -> tuple[str, ...]:
    value = _list(d, key)
    if not all(type(item) is str for item in value):
        raise _Unsure
    return tuple(value)


def _objects(d: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = _list(d, key)
    if not all(type(item) is dict for item in value):
        raise _Unsure
    return value


def _plain(value: Any, depth: int = 0) -> Any:
    """A JSON value as ``model_dump(mode="json")`` copies an ``Any`` member."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int and -_INT64 <= value < _INT64:
        return value
    if kind is float and math.isfinite(value):
        return value
    if depth < _PLAIN_DEPTH:
        if kind is dict:
            if not all(type(k) is str and k.isascii() for k in value):
                raise _Unsure
            return {k: _plain(v, depth + 1) for k, v in value.items()}
        if kind is list:
            return [_plain(v, depth + 1) for v in value]
    raise _Unsure


# Nested models.
def _agent_context(d: dict[str, Any]) -> dict[str, Any]:
    ctx = _dict(d, "agent_context", _AGENT_CONTEXT_KEYS)
    _text(ctx, "agent_did", 512, 1)
    _matching(ctx, "tenant_id", _TENANT_ID)
    _opt_text(ctx, "user_did", 512)
    _text_or(ctx, "session_id", "", 512)
    return ctx


def _check_request_options(d: dict[str, Any]) -> tuple[Priority, str | None]:
    """``resource_limits``, ``checkpoint_config``, ``document_context`` and
    ``execution_options`` (InvokeRequested and InvokeAuthorized); the priority and key."""
    if "resource_limits" in d:
        limits = _dict(d, "resource_limits", _RESOURCE_LIMITS_KEYS)
        _opt_int(limits, "cpu_millicore_limit", ge=1)
        _opt_int(limits, "memory_mb_limit", ge=1)
        timeout = _opt_float(limits, "timeout_seconds")
        if timeout is not None and not 0 < timeout <= 86_400:
            raise _Unsure
    if "checkpoint_config" in d:
        config = _dict(d, "checkpoint_config", _CHECKPOINT_CONFIG_KEYS)
        _bool(config, "enable_checkpointing", default=True)
        if not _float(config, "checkpoint_interval_seconds", 30) >= 0:
            raise _Unsure
        _opt_text(config, "resume_from_checkpoint_id")
    if d.get("document_context") is not None:
        documents = _dict(d, "document_context", _DOCUMENT_CONTEXT_KEYS)
        _opt_text(documents, "source", 256)
        refs = _objects(documents, "documents")
        if len(refs) > 256:
            raise _Unsure
        ids = set()
        for ref in refs:
            if not ref.keys() <= _DOCUMENT_REF_KEYS:
                raise _Unsure
            ids.add(_matching(ref, "document_id", _DOCUMENT_ID))
            version = _opt_text(ref, "version", 128)
            if version == "":
                raise _Unsure
        if len(ids) != len(refs):
            raise _Unsure
    if "execution_options" not in d:
        return Priority.NORMAL, None
    opts = _dict(d, "execution_options", _EXECUTION_OPTIONS_KEYS)
    _bool(opts, "async_mode", default=True)
    _bool(opts, "require_approval", default=False)
    return _member(opts, "priority", _PRIORITIES, Priority.NORMAL), _opt_text(
        opts, "idempotency_key", 256
    )


def _execution_metadata(
    d: dict[str, Any],
) -> tuple[dict[str, Any], datetime | None, datetime | None]:
    """ExecutionMetadata as ``model_dump(mode="json")``, with its two datetimes."""
    meta = _dict(d, "execution_metadata") if "execution_metadata" in d else {}
    started, completed = _opt_datetime(meta, "started_at"), _opt_datetime(meta, "completed_at")
    checkpoints = [
        {
            "checkpoint_id": _text(ref, "checkpoint_id"),
            "checkpoint_type": _literal(ref, "checkpoint_type", _CHECKPOINT_TYPES, "micro"),
            "timestamp": _json_datetime(_datetime(ref.get("timestamp"))),
        }
        for ref in _objects(meta, "checkpoints_created")
    ]
    attachments = [
        {
            "kind": _literal(att, "kind", frozenset({"blob"}), "blob"),
            "url": _text(att, "url"),
            "content_type": _text(att, "content_type"),
            "bytes": _int(att, "bytes"),
        }
        for att in _objects(meta, "attachments")
    ]
    dump = {
        "duration_ms": _int(meta, "duration_ms", 0),
        "started_at": _json_datetime(started),
        "completed_at": _json_datetime(completed),
        "attempts": _int(meta, "attempts", 1),
        "cpu_used_millicore_seconds": _float(meta, "cpu_used_millicore_seconds", 0),
        "memory_peak_mb": _float(meta, "memory_peak_mb", 0),
        "checkpoints_created": checkpoints,
        "cached": _bool(meta, "cached", default=False),
        "truncated": _bool(meta, "truncated", default=False),
        "attachments": attachments,
        "resumed_from_checkpoint_id": _opt_text(meta, "resumed_from_checkpoint_id"),
    }
    return dump, started, completed


def _documents_accessed(d: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    return tuple(
        {
            "document_id": _text(doc, "document_id"),
            "version": _text(doc, "version"),
            "access": _literal(doc, "access", _ACCESS_KINDS, ""),
        }
        for doc in _objects(d, "documents_accessed")
    )


def _error_info(d: dict[str, Any]) -> dict[str, Any] | None:
    """ErrorInfo (strict) as ``model_dump(mode="json")``."""
    if d.get("error") is None:
        return None
    error = _dict(d, "error", _ERROR_INFO_KEYS)
    return {
        "code": _member(error, "code", _ERROR_CODES).value,
        "message": _text(error, "message"),
        "details": _plain(_dict(error, "details")) if "details" in error else {},
        "retryable": _bool(error, "retryable", default=False),
        "retry_after_s": _opt_float(error, "retry_after_s"),
    }


# Readers, fast then slow, per event type.
def _requested_fast(event: Envelope, d: dict[str, Any], base: dict[str, Any]) -> Fact | None:
    if not d.keys() <= _REQUESTED_KEYS:
        raise _Unsure
    _text(d, "tool_id", 256, 1)
    _text_or(d, "tool_version", "*", 64)
    ctx = _agent_context(d)
    parameters = _json_object(d, "parameters") if "parameters" in d else {}
    if nesting_depth_exceeds(parameters, MAX_PARAMETER_DEPTH):
        raise _Unsure
    _opt_text(d, "capability_token", 16_384)
    _opt_text(d, "connection_id", 256)
    priority, idempotency_key = _check_request_options(d)
    if d.get("invocation_id") is None:
        invocation_id = invocation_uuid(event.id)
    else:
        invocation_id = _uuid(d, "invocation_id").lower()
    tenant_id = ctx["tenant_id"]
    if event.tenantid is not None and event.tenantid != tenant_id:
        return None  # policy refuses it; its outcome names the invocation
    attribute = event.invocationid
    if (
        attribute is not None
        and attribute != invocation_id
        and invocation_uuid(attribute) != invocation_id
    ):
        return None  # as policy: the attribute and the body disagree
    return _fact(
        Kind.REQUESTED,
        base,
        invocation_id=invocation_id,
        tenant_id=tenant_id,
        tool_id=d["tool_id"],
        agent_did=ctx["agent_did"],
        user_did=ctx.get("user_did"),
        session_id=ctx.get("session_id", ""),
        requested_version=d.get("tool_version", "*"),
        priority=priority.value,
        idempotency_key=idempotency_key,
        parameters=sanitize_parameters(parameters),
    )


def _control_fast(kind: Kind) -> _FastReader:
    keys = _CANCEL_KEYS if kind is Kind.CANCEL_REQUESTED else _DECISION_KEYS
    actor = "requested_by" if kind is Kind.CANCEL_REQUESTED else "approver"

    def read(event: Envelope, d: dict[str, Any], base: dict[str, Any]) -> Fact | None:
        if not d.keys() <= keys:
            raise _Unsure
        _uuid(d, "invocation_id")
        tenant_id = _matching(d, "tenant_id", _TENANT_ID)
        _text_or(d, actor, "", 512)
        _text_or(d, "reason", "", 1024)
        _opt_text(d, "signature", 4096)
        if d.get("parameters_hash") is not None:
            _matching(d, "parameters_hash", _SHA256_HEX)
        if event.tenantid is not None and event.tenantid != tenant_id:
            return None
        return _fact(kind, base, tenant_id=tenant_id)

    return read


def _authorized_fast(event: Envelope, d: dict[str, Any], base: dict[str, Any]) -> Fact:
    _uuid(d, "invocation_id")
    ctx = _agent_context(d)
    parameters = _json_object(d, "parameters")
    _opt_text(d, "connection_id")
    _member(d, "effect", _EFFECTS)
    _float(d, "timeout_seconds")
    priority, idempotency_key = _check_request_options(d)
    warnings = _texts(d, "warnings")
    _datetime(d.get("requested_at"))
    _opt_int(d, "max_result_bytes")
    _int(d, "max_concurrent_per_agent", 4)
    _opt_text(d, "grant")
    return _fact(
        Kind.AUTHORIZED,
        base,
        tool_id=_text(d, "tool_id"),
        agent_did=ctx["agent_did"],
        user_did=ctx.get("user_did"),
        session_id=ctx.get("session_id", ""),
        requested_version=_text(d, "requested_version"),
        tool_version=_text(d, "tool_version"),
        priority=priority.value,
        idempotency_key=idempotency_key,
        parameters=sanitize_parameters(parameters),
        warnings=warnings,
    )


def _approval_requested_fast(event: Envelope, d: dict[str, Any], base: dict[str, Any]) -> Fact:
    _uuid(d, "invocation_id")
    _text(d, "tenant_id")
    _member(d, "effect", _EFFECTS)
    _text(d, "reason")
    _datetime(d.get("expires_at"))
    return _fact(
        Kind.APPROVAL_REQUESTED,
        base,
        tool_id=_text(d, "tool_id"),
        agent_did=_text(d, "agent_did"),
        tool_version=_text(d, "tool_version"),
        parameters_hash=_text(d, "parameters_hash"),
    )


def _invoked_fast(event: Envelope, d: dict[str, Any], base: dict[str, Any]) -> Fact:
    _uuid(d, "invocation_id")
    _text(d, "tenant_id")
    return _fact(
        Kind.INVOKED,
        base,
        tool_id=_text(d, "tool_id"),
        agent_did=_text(d, "agent_did"),
        tool_version=_text(d, "tool_version"),
        started_at=_datetime(d.get("started_at")),
        attempt=_int(d, "attempt", 1),
        worker_id=_text(d, "worker_id"),
        resumed_from_checkpoint_id=_opt_text(d, "resumed_from_checkpoint_id"),
    )


def _checkpoint_fast(event: Envelope, d: dict[str, Any], base: dict[str, Any]) -> Fact:
    _uuid(d, "invocation_id")
    _text(d, "tenant_id")
    progress = _float(d, "progress_percent")
    if not 0 <= progress <= 100:
        raise _Unsure
    checkpoint = _new(
        Checkpoint,
        {
            "checkpoint_id": _text(d, "checkpoint_id"),
            "checkpoint_type": _literal(d, "checkpoint_type", _CHECKPOINT_TYPES, "micro"),
            "progress_percent": progress,
            "current_phase": _text_or(d, "current_phase", ""),
            "timestamp": _datetime(d.get("timestamp")),
        },
    )
    return _fact(Kind.CHECKPOINT, base, tool_id=_text(d, "tool_id"), checkpoint=checkpoint)


def _executed_fast(event: Envelope, d: dict[str, Any], base: dict[str, Any]) -> Fact:
    _uuid(d, "invocation_id")
    ctx = _agent_context(d)
    _json_object(d, "result")
    if d.get("result_blob") is not None:
        blob = _dict(d, "result_blob")
        _text(blob, "blob_id", 64, 1)
        _int(blob, "bytes", ge=0)
    _texts(d, "warnings")
    _dict(d, "execution_metadata")  # required here, defaulted in an outcome
    _execution_metadata(d)
    _opt_text(d, "checkpoint_ref")
    _documents_accessed(d)
    return _fact(
        Kind.EXECUTED,
        base,
        tool_id=_text(d, "tool_id"),
        agent_did=ctx["agent_did"],
        tool_version=_text(d, "tool_version"),
    )


def _terminal_fast(event: Envelope, d: dict[str, Any], base: dict[str, Any]) -> Fact:
    _uuid(d, "invocation_id")
    status = _member(d, "status", _STATUSES)
    if status not in _TERMINAL_STATUSES:
        raise _Unsure  # the slow reader raises InvalidEvent for it
    tenant_id = _text(d, "tenant_id")
    result = None if d.get("result") is None else _json_object(d, "result")
    meta, started_at, completed_at = _execution_metadata(d)
    _opt_text(d, "checkpoint_ref")
    return _fact(
        Kind.TERMINAL,
        base,
        tenant_id=base["tenant_id"] or tenant_id,
        tool_id=_text(d, "tool_id"),
        agent_did=_text(d, "agent_did"),
        tool_version=_opt_text(d, "tool_version"),
        status=status,
        result=result,
        error=_error_info(d),
        execution_metadata=meta,
        documents_accessed=_documents_accessed(d),
        warnings=_texts(d, "warnings"),
        started_at=started_at,
        completed_at=completed_at,
    )


def _fact(kind: Kind, base: dict[str, Any], **values: Any) -> Fact:
    return _new(Fact, {**_FACT_DEFAULTS, "kind": kind, **base, **values})


_D = TypeVar("_D")


def _new(cls: type[_D], values: dict[str, Any]) -> _D:
    """``cls(**values)`` for a frozen dataclass, without its ``__init__``.

    A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``,
    the single largest cost of folding an event; these classes have no
    ``__post_init__`` and ``values`` names every field, so the instance is the same.
    """
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


# The slow readers: the event's pydantic model decides.
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


def _slow(kind: Kind) -> _SlowReader:
    def read(event: Envelope, base: dict[str, Any]) -> Fact | None:
        return _control(event, kind, base) if kind in _CONTROL else _internal(event, kind, base)

    return read


_READERS: Final[dict[str, tuple[_FastReader, _SlowReader]]] = {
    EventType.INVOKE_REQUESTED: (_requested_fast, _requested),
    EventType.INVOKE_AUTHORIZED: (_authorized_fast, _slow(Kind.AUTHORIZED)),
    EventType.APPROVAL_REQUESTED: (_approval_requested_fast, _slow(Kind.APPROVAL_REQUESTED)),
    EventType.INVOKED: (_invoked_fast, _slow(Kind.INVOKED)),
    EventType.CHECKPOINT_CREATED: (_checkpoint_fast, _slow(Kind.CHECKPOINT)),
    EventType.INVOKE_EXECUTED: (_executed_fast, _slow(Kind.EXECUTED)),
    **dict.fromkeys(TERMINAL_TYPES, (_terminal_fast, _terminal)),
    EventType.CANCEL_REQUESTED: (
        _control_fast(Kind.CANCEL_REQUESTED),
        _slow(Kind.CANCEL_REQUESTED),
    ),
    EventType.APPROVAL_GRANTED: (
        _control_fast(Kind.APPROVAL_GRANTED),
        _slow(Kind.APPROVAL_GRANTED),
    ),
    EventType.APPROVAL_DENIED: (_control_fast(Kind.APPROVAL_DENIED), _slow(Kind.APPROVAL_DENIED)),
}
"""Per event type: the fast reader, and the pydantic one it falls back to."""


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
    elif fact.tenant_id is not None and fact.tenant_id != row.tenant_id:
        return row
    else:
        values = dict(row.__dict__)
    # Every merge below edits ``values``; the row is built once, at the end.
    _merge_identity(values, fact, kind)
    _merge_progress(values, fact, kind)
    _merge_status(values, fact, kind)
    _merge_phase(values, kind)
    return _new(InvocationRow, values)


def _merge_identity(row: dict[str, Any], fact: Fact, kind: Kind) -> None:
    if kind is Kind.REQUESTED:
        row["tool_id"] = fact.tool_id or row["tool_id"]
        row["agent_did"] = fact.agent_did
        row["user_did"] = fact.user_did
        row["session_id"] = fact.session_id
        row["requested_version"] = fact.requested_version
        row["parameters"] = fact.parameters
        row["trace_id"] = fact.trace_id or row["trace_id"]
    else:
        # Fill what is unknown; never overwrite what an earlier event established.
        for name in _FILLED_BY_ANY:
            if row[name] is None:
                row[name] = getattr(fact, name)
    if kind in _OPTIONS_OWNERS:
        row["priority"] = fact.priority or row["priority"]
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
        row["status"] = fact.status
        row["result"] = fact.result
        row["error"] = fact.error
        row["warnings"] = fact.warnings or ()
        row["execution_metadata"] = fact.execution_metadata
        row["documents_accessed"] = fact.documents_accessed
        row["completed_at"] = fact.completed_at or fact.occurred_at
        return
    if kind is Kind.AUTHORIZED and fact.warnings is not None:
        row["warnings"] = fact.warnings
    new = _STATUS_OF_KIND.get(kind)
    if new is not None and _STATUS_RANK[new] > _STATUS_RANK[status]:
        row["status"] = new


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
_STATUS_RANK: Final = {status: status_rank(status) for status in InvocationStatus}
