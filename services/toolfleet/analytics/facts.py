"""Audit event → :class:`AuditFact`, the few fields analytics counts. Pure.

Lenient like the audit record it reads: a missing or odd field is left out, and an
event without a tenant is no fact at all (analytics is per tenant).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from toolfleet.errors import ErrorCode
from toolfleet.events.types import TERMINAL_TYPES, EventType

#: Outcome statuses that count as the tool failing (for error rates).
ERROR_STATUSES: Final = frozenset({"error", "timeout"})
#: Error codes that mean someone said no (counted as denials).
DENIAL_CODES: Final = frozenset({ErrorCode.PERMISSION_DENIED, ErrorCode.APPROVAL_DENIED})
#: Label values are bounded: an error code outside the contract's list counts as this.
OTHER: Final = "other"
_KNOWN_CODES: Final = frozenset(code.value for code in ErrorCode)
_KNOWN_STATUSES: Final = frozenset(
    {"success", "error", "timeout", "cancelled", "permission_denied"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditFact:
    """What analytics takes from one audit event."""

    audit_id: str
    tenant_id: str
    at: float
    """When the fact happened (epoch seconds): windows follow event time, not arrival."""
    event_type: str
    agent_did: str | None = None
    tool_id: str | None = None
    status: str | None = None
    """Terminal status (bounded: unknown values become ``other``); None before the end."""
    error_code: str | None = None
    """Error code of a failure (bounded like ``status``)."""
    duration_ms: float | None = None
    cpu_millicore_s: float | None = None
    memory_peak_mb: float | None = None

    @property
    def is_request(self) -> bool:
        """An agent asked for a tool call (``invoke.requested``)."""
        return self.event_type == EventType.INVOKE_REQUESTED

    @property
    def is_outcome(self) -> bool:
        """A terminal outcome: exactly one per invocation."""
        return self.status is not None

    @property
    def is_denial(self) -> bool:
        return self.status == "permission_denied" or self.error_code in DENIAL_CODES

    @property
    def is_error(self) -> bool:
        return self.status in ERROR_STATUSES


def fact_of(data: Mapping[str, Any]) -> AuditFact | None:
    """The fact in an audit event's ``data`` (an audit record), or None if it has none."""
    tenant = _text(data.get("tenant_id"))
    event_type = _text(data.get("event_type"))
    audit_id = _text(data.get("audit_id"))
    at = _epoch(data.get("occurred_at"))
    if not tenant or not event_type or not audit_id or at is None:
        return None
    terminal = event_type in TERMINAL_TYPES
    status = _bounded(_text(data.get("status")), _KNOWN_STATUSES) if terminal else None
    code = _bounded(_text(data.get("error_code")), _KNOWN_CODES) if terminal else None
    unmapped = _dict(_dict(data.get("ocsf")).get("unmapped"))
    return AuditFact(
        audit_id=audit_id,
        tenant_id=tenant,
        at=at,
        event_type=event_type,
        agent_did=_text(data.get("agent_did")),
        tool_id=_text(data.get("tool_id")),
        status=status or (OTHER if terminal else None),
        error_code=code,
        duration_ms=_number(unmapped.get("duration_ms")) if terminal else None,
        cpu_millicore_s=_number(unmapped.get("cpu_used_millicore_seconds")) if terminal else None,
        memory_peak_mb=_number(unmapped.get("memory_peak_mb")) if terminal else None,
    )


def _bounded(value: str | None, known: frozenset[str]) -> str | None:
    if value is None:
        return None
    return value if value in known else OTHER


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def _epoch(value: Any) -> float | None:
    if isinstance(value, datetime):
        return value.timestamp()
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None
