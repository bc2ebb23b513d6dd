"""Lifecycle event → :class:`AuditRecord` (and the audit event that carries it). Pure.

Reading is lenient on purpose: audit records every lifecycle event, including the
malformed ones other stages reject, so fields are picked from ``data`` by type and a
missing or odd one is simply left out. Only metadata is kept: parameters are sanitized
and only for ``invoke.requested``/``invoke.authorized``; the ``capability_token``,
tool results and free-text payloads never reach the record.

``auth`` comes from the ``authtype``/``authid`` attributes, except on
``invoke.requested``: policy has not verified that event yet, so whatever a producer
put there is a claim, not an identity, and is dropped (policy does the same).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Literal, cast

from toolfleet.audit import ocsf
from toolfleet.events.envelope import Envelope, derived_event_id, new_event
from toolfleet.events.identity import invocation_id_of, tenant_of, trace_id_of
from toolfleet.events.models import AuditRecord, SourceEventRef
from toolfleet.events.sanitize import mask_text, sanitize_parameters
from toolfleet.events.types import TERMINAL_TYPES, EventType, Source

Outcome = Literal["success", "failure", "pending", "info"]

_MAX_TEXT: Final = 512

#: ``(outcome, status)`` for every non-terminal type; terminal ones read ``data.status``.
_SHAPE: Final[dict[str, tuple[Outcome, str | None]]] = {
    EventType.INVOKE_REQUESTED: ("pending", "pending"),
    EventType.INVOKE_AUTHORIZED: ("success", "pending"),
    EventType.APPROVAL_REQUESTED: ("pending", "pending_approval"),
    EventType.APPROVAL_GRANTED: ("success", None),
    EventType.APPROVAL_DENIED: ("failure", None),
    EventType.INVOKED: ("info", "running"),
    EventType.CHECKPOINT_CREATED: ("info", "running"),
    EventType.INVOKE_EXECUTED: ("info", "running"),
    EventType.CANCEL_REQUESTED: ("info", None),
    EventType.CONTROL_REFUSED: ("failure", None),
}

_CODE_OF_TYPE: Final[dict[str, str]] = {
    EventType.APPROVAL_DENIED: "approval_denied",
    EventType.CONTROL_REFUSED: "permission_denied",
}
_WITH_PARAMETERS: Final = frozenset({EventType.INVOKE_REQUESTED, EventType.INVOKE_AUTHORIZED})
#: Producer-written events: their auth attributes are claims nobody verified.
_UNVERIFIED_AUTH: Final = frozenset(
    {
        EventType.INVOKE_REQUESTED,
        EventType.CANCEL_REQUESTED,
        EventType.APPROVAL_GRANTED,
        EventType.APPROVAL_DENIED,
    }
)


def audit_event(parent: Envelope, *, topic: str, now: datetime) -> Envelope:
    """The audit event for ``parent``: same type, deterministic id, same trace."""
    audit_id = derived_event_id(parent, parent.type)
    record = audit_record(parent, topic=topic, audit_id=audit_id, now=now)
    inherited = parent
    if parent.type in _UNVERIFIED_AUTH:
        inherited = parent.model_copy(update={"authtype": None, "authid": None})
    return new_event(
        # The audit event keeps the source type even when toolfleet does not know it.
        event_type=cast(EventType, parent.type),
        source=Source.AUDIT,
        data=record,
        tenant_id=record.tenant_id or "",
        invocation_id=record.invocation_id,
        event_id=audit_id,
        parent=inherited,
    )


def audit_record(event: Envelope, *, topic: str, audit_id: str, now: datetime) -> AuditRecord:
    """The PII-safe audit record of one lifecycle event, with its OCSF projection."""
    data = event.data
    agent = _dict(data.get("agent_context"))
    outcome, status, error_code = _shape(event)
    agent_did = _text(agent.get("agent_did")) or _text(data.get("agent_did"))
    draft = AuditRecord(
        audit_id=audit_id,
        event_type=event.type,
        occurred_at=event.time or now,
        tenant_id=tenant_of(event),
        invocation_id=invocation_id_of(event),
        agent_did=agent_did,
        user_did=_text(agent.get("user_did")),
        tool_id=_text(data.get("tool_id")),
        tool_version=_text(data.get("tool_version")),
        action=event.type.removeprefix("ai.agent."),
        outcome=outcome,
        status=status,
        error_code=error_code,
        actor=_actor(event, agent_did),
        auth=_auth(event),
        parameters=_parameters(event),
        trace_id=trace_id_of(event.traceparent),
        source_event=SourceEventRef(source=event.source, id=event.id, type=event.type, topic=topic),
        ocsf={},
    )
    projection = ocsf.api_activity(
        draft,
        source_app=event.source,
        logged_at=now,
        details=_details(event),
        error_message=_error_message(data),
    )
    return draft.model_copy(update={"ocsf": projection})


def _shape(event: Envelope) -> tuple[Outcome, str | None, str | None]:
    """``(outcome, status, error_code)`` of an event."""
    if event.type in TERMINAL_TYPES:
        status = _text(event.data.get("status"))
        code = _text(_dict(event.data.get("error")).get("code"))
        return ("success" if status == "success" else "failure"), status, code
    if event.type == EventType.EGRESS:
        allowed = event.data.get("decision") == "allowed"
        return ("success", None, None) if allowed else ("failure", None, "permission_denied")
    outcome, status = _SHAPE.get(event.type, ("info", None))
    code = _CODE_OF_TYPE.get(event.type)
    return outcome, status, code


def _actor(event: Envelope, agent_did: str | None) -> str | None:
    if event.type in {EventType.APPROVAL_GRANTED, EventType.APPROVAL_DENIED}:
        return _text(event.data.get("approver")) or None
    if event.type == EventType.CANCEL_REQUESTED:
        return _text(event.data.get("requested_by")) or None
    if event.type == EventType.CONTROL_REFUSED:
        return _text(event.data.get("actor")) or None
    if event.type == EventType.TOOL_LIFECYCLE_CHANGED:
        return _text(event.data.get("operator")) or None
    return agent_did


def _auth(event: Envelope) -> dict[str, str]:
    if event.type in _UNVERIFIED_AUTH:
        return {}
    auth = {"authtype": event.authtype, "authid": event.authid}
    return {k: v for k, v in auth.items() if v}


def _parameters(event: Envelope) -> dict[str, Any] | None:
    if event.type not in _WITH_PARAMETERS:
        return None
    parameters = event.data.get("parameters")
    return sanitize_parameters(parameters) if isinstance(parameters, Mapping) else {}


def _details(event: Envelope) -> dict[str, Any]:
    """Metadata worth a SIEM's time, never a result body, parameters or a token."""
    data = event.data
    meta = _dict(data.get("execution_metadata"))
    options = _dict(data.get("execution_options"))
    picked: dict[str, Any] = {
        "duration_ms": meta.get("duration_ms"),
        "cpu_used_millicore_seconds": meta.get("cpu_used_millicore_seconds"),
        "memory_peak_mb": meta.get("memory_peak_mb"),
        "attempts": meta.get("attempts", data.get("attempt")),
        "cached": meta.get("cached"),
        "truncated": meta.get("truncated"),
        "started_at": meta.get("started_at", data.get("started_at")),
        "completed_at": meta.get("completed_at"),
        "requested_version": data.get("requested_version"),
        "priority": options.get("priority"),
        "require_approval": options.get("require_approval"),
        "idempotency_key": options.get("idempotency_key"),
        "effect": data.get("effect"),
        "timeout_seconds": data.get("timeout_seconds"),
        "worker_id": data.get("worker_id"),
        "checkpoint_id": data.get("checkpoint_id"),
        "checkpoint_type": data.get("checkpoint_type"),
        "progress_percent": data.get("progress_percent"),
        "current_phase": data.get("current_phase"),
        "resumed_from_checkpoint_id": data.get(
            "resumed_from_checkpoint_id", meta.get("resumed_from_checkpoint_id")
        ),
        "reason": data.get("reason"),
        "control_type": data.get("control_type"),
        "refused_event_id": data.get("refused_event_id"),
        "circuit_name": data.get("circuit_name"),
        "circuit_state": data.get("state"),
        "lifecycle_state": data.get("lifecycle_state"),
        "previous_state": data.get("previous_state"),
        "sunset_date": data.get("sunset_date"),
        "deprecated_in_favor_of": data.get("deprecated_in_favor_of"),
        "retry_after_s": data.get("retry_after_s"),
        "expires_at": data.get("expires_at"),
        "retryable": _dict(data.get("error")).get("retryable"),
        "warnings": data.get("warnings") or None,
        "documents_accessed": [
            f"{d.get('document_id')}@{d.get('version')}:{d.get('access')}"
            for d in data.get("documents_accessed") or []
            if isinstance(d, dict)
        ]
        or None,
    }
    return {k: _scalar(v) for k, v in picked.items() if _scalar(v) is not None}


def _scalar(value: Any) -> Any:
    """JSON scalars only (strings masked and clipped); lists of strings masked too."""
    if isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return mask_text(value[:_MAX_TEXT])
    if isinstance(value, list):
        texts = [mask_text(v[:_MAX_TEXT]) for v in value[:32] if isinstance(v, str)]
        return texts or None
    return None


def _error_message(data: Mapping[str, Any]) -> str | None:
    message = _text(_dict(data.get("error")).get("message"))
    return mask_text(message) if message else None


def _text(value: Any) -> str | None:
    return value[:_MAX_TEXT] if isinstance(value, str) and value else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
