"""The audit record as it was built before its per-record cost was cut (reference).

A verbatim copy of ``toolfleet.audit.records``' and ``toolfleet.audit.ocsf``' record
building from before the fast path (pydantic round trips and all), kept so
``tests/unit/test_audit_equivalence.py`` can hold the fast path to it on random events,
beyond the pinned golden ones. Not used by the fleet.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Literal, cast

from toolfleet.audit.ocsf import CATEGORY_UID, CLASS_UID, OCSF_VERSION, PRODUCT, activity_of
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
    projection = api_activity(
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


_STATUS: Final = {"success": (1, "Success"), "failure": (2, "Failure")}
_SEVERITY_NAMES: Final = {1: "Informational", 2: "Low", 3: "Medium"}
_SECURITY_CODES: Final = frozenset({"permission_denied", "approval_denied"})


def severity_of(record: AuditRecord) -> int:
    if record.error_code in _SECURITY_CODES or record.status == "permission_denied":
        return 3
    if record.event_type == EventType.CIRCUIT_OPENED:
        return 3
    return 2 if record.outcome == "failure" else 1


def epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def api_activity(
    record: AuditRecord,
    *,
    source_app: str,
    logged_at: datetime,
    details: Mapping[str, Any] | None = None,
    error_message: str | None = None,
) -> dict[str, Any]:
    """The OCSF API Activity event for ``record``.

    Args:
        record: The audit record (its own ``ocsf`` member is ignored).
        source_app: ``source`` of the lifecycle event: the service or client that
            produced it (``actor.app_name``, ``src_endpoint.svc_name``).
        logged_at: When audit processed it (``metadata.logged_time``).
        details: Already-sanitized metadata without an OCSF home (``unmapped``);
            ``duration_ms`` also becomes ``duration``.
        error_message: Already-masked error text (``status_detail``).
    """
    details = dict(details or {})
    activity_id, activity_name = activity_of(record.event_type)
    status_id, status = _STATUS.get(record.outcome, (0, "Unknown"))
    severity_id = severity_of(record)
    event: dict[str, Any] = {
        "activity_id": activity_id,
        "activity_name": activity_name,
        "category_uid": CATEGORY_UID,
        "category_name": "Application Activity",
        "class_uid": CLASS_UID,
        "class_name": "API Activity",
        "type_uid": CLASS_UID * 100 + activity_id,
        "type_name": f"API Activity: {activity_name}",
        "time": epoch_ms(record.occurred_at),
        "severity_id": severity_id,
        "severity": _SEVERITY_NAMES[severity_id],
        "status_id": status_id,
        "status": status,
        "message": _message(record),
        "api": _api(record, error_message),
        "actor": _ocsf_actor(record, source_app),
        "src_endpoint": {"svc_name": source_app},
        "cloud": {"provider": PRODUCT},
        "metadata": _metadata(record, logged_at),
        "unmapped": _unmapped(record, details),
    }
    if record.error_code:
        event["status_code"] = record.error_code
    if error_message:
        event["status_detail"] = error_message
    if isinstance(details.get("duration_ms"), int):
        event["duration"] = details["duration_ms"]
    if record.tool_id:
        resource: dict[str, Any] = {"uid": record.tool_id, "type": "tool"}
        if record.tool_version:
            resource["version"] = record.tool_version
        event["resources"] = [resource]
    return event


def _message(record: AuditRecord) -> str:
    subject = f" {record.tool_id}" if record.tool_id else ""
    status = f" ({record.status})" if record.status else ""
    return f"{record.action}{subject}{status}"


def _api(record: AuditRecord, error_message: str | None) -> dict[str, Any]:
    api: dict[str, Any] = {"operation": record.event_type, "service": {"name": PRODUCT}}
    if record.invocation_id:
        api["request"] = {"uid": record.invocation_id}
    if record.error_code:
        response: dict[str, Any] = {"error": record.error_code}
        if error_message:
            response["error_message"] = error_message
        api["response"] = response
    return api


def _ocsf_actor(record: AuditRecord, source_app: str) -> dict[str, Any]:
    actor: dict[str, Any] = {"app_name": source_app}
    if record.actor:
        is_agent = record.actor == record.agent_did
        actor["user"] = (
            {"uid": record.actor, "type": "agent", "type_id": 99}
            if is_agent
            else {"uid": record.actor, "type": "User", "type_id": 1}
        )
    return actor


def _metadata(record: AuditRecord, logged_at: datetime) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "version": OCSF_VERSION,
        "product": {"name": PRODUCT, "vendor_name": PRODUCT},
        "uid": record.audit_id,
        "original_event_uid": record.source_event.id,
        "event_code": record.event_type,
        "log_name": "audit",
        "original_time": record.occurred_at.isoformat(),
        "logged_time": epoch_ms(logged_at),
    }
    if record.invocation_id:
        metadata["correlation_uid"] = record.invocation_id
    if record.tenant_id:
        metadata["tenant_uid"] = record.tenant_id
    return metadata


def _unmapped(record: AuditRecord, details: Mapping[str, Any]) -> dict[str, Any]:
    unmapped: dict[str, Any] = {
        "action": record.action,
        "outcome": record.outcome,
        "source_event": record.source_event.model_dump(),
    }
    optional = {
        "status": record.status,
        "trace_id": record.trace_id,
        "user_did": record.user_did,
        "agent_did": record.agent_did,
        "auth": record.auth or None,
    }
    unmapped.update({k: v for k, v in optional.items() if v is not None})
    unmapped.update({k: v for k, v in details.items() if v is not None})
    return unmapped
