"""Lifecycle event → :class:`AuditRecord` (and the audit event that carries it). Pure.

Reading is lenient on purpose: audit records every lifecycle event, including the
malformed ones other stages reject, so fields are picked from ``data`` by type and a
missing or odd one is simply left out. Only metadata is kept: parameters are sanitized
and only for ``invoke.requested``/``invoke.authorized``; the ``capability_token``,
tool results and free-text payloads never reach the record.

``auth`` comes from the ``authtype``/``authid`` attributes, except on
``invoke.requested``: policy has not verified that event yet, so whatever a producer
put there is a claim, not an identity, and is dropped (policy does the same).

Audit sees every event of every call, so the record is built straight in its JSON form
(what ``AuditRecord.model_dump(mode="json")`` gives), never validated into a model and
dumped back; ``tests/unit/test_audit_golden.py`` pins that form byte for byte.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final, Literal, cast

from pydantic import TypeAdapter

from toolfleet.audit import ocsf
from toolfleet.events.envelope import Envelope, derived_event_id, new_event
from toolfleet.events.identity import invocation_id_of, tenant_of, trace_id_of
from toolfleet.events.masking import mask_parameters, mask_text
from toolfleet.events.models import AuditRecord
from toolfleet.events.types import TERMINAL_TYPES, EventType, Source

Outcome = Literal["success", "failure", "pending", "info"]

_MAX_TEXT: Final = 512

#: ``(outcome, status)`` for every non-terminal type; terminal ones read ``data.status``.
_SHAPE: Final[dict[str, tuple[Outcome, str | None]]] = {
    EventType.INVOKE_REQUESTED: ("pending", "pending"),
    EventType.INVOKE_AUTHORIZED: ("success", "pending"),
    EventType.APPROVAL_REQUESTED: ("pending", "pending_approval"),
    EventType.INVOKE_QUEUED: ("pending", "queued"),
    EventType.APPROVAL_GRANTED: ("success", None),
    EventType.APPROVAL_DENIED: ("failure", None),
    EventType.INVOKED: ("info", "running"),
    EventType.CHECKPOINT_CREATED: ("info", "running"),
    EventType.INVOKE_EXECUTED: ("info", "running"),
    EventType.CANCEL_REQUESTED: ("info", None),
    EventType.CONTROL_REFUSED: ("failure", None),
    EventType.OUTCOME_REFUSED: ("failure", None),
}

_CODE_OF_TYPE: Final[dict[str, str]] = {
    EventType.APPROVAL_DENIED: "approval_denied",
    EventType.CONTROL_REFUSED: "permission_denied",
    EventType.OUTCOME_REFUSED: "permission_denied",
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
#: Who caused an event, by type: the ``data`` member naming them (else the agent).
_ACTOR_KEY: Final[dict[str, str]] = {
    EventType.APPROVAL_GRANTED: "approver",
    EventType.APPROVAL_DENIED: "approver",
    EventType.CANCEL_REQUESTED: "requested_by",
    EventType.CONTROL_REFUSED: "actor",
    EventType.OUTCOME_REFUSED: "actor",
    EventType.TOOL_LIFECYCLE_CHANGED: "operator",
}

# Where each ``unmapped`` detail is read, in output order: ``(name, source, key,
# fallback)``, the fallback ``(source, key)`` read when the first key is absent. Sources
# index ``(data, execution_metadata, execution_options, error)``.
_DATA, _META, _OPTIONS, _ERROR = 0, 1, 2, 3
_DETAILS: Final[tuple[tuple[str, int, str, tuple[int, str] | None], ...]] = (
    ("duration_ms", _META, "duration_ms", None),
    ("cpu_used_millicore_seconds", _META, "cpu_used_millicore_seconds", None),
    ("memory_peak_mb", _META, "memory_peak_mb", None),
    ("attempts", _META, "attempts", (_DATA, "attempt")),
    ("cached", _META, "cached", None),
    ("truncated", _META, "truncated", None),
    ("started_at", _META, "started_at", (_DATA, "started_at")),
    ("completed_at", _META, "completed_at", None),
    ("requested_version", _DATA, "requested_version", None),
    ("priority", _OPTIONS, "priority", None),
    ("require_approval", _OPTIONS, "require_approval", None),
    ("idempotency_key", _OPTIONS, "idempotency_key", None),
    ("effect", _DATA, "effect", None),
    ("timeout_seconds", _DATA, "timeout_seconds", None),
    ("worker_id", _DATA, "worker_id", None),
    ("checkpoint_id", _DATA, "checkpoint_id", None),
    ("checkpoint_type", _DATA, "checkpoint_type", None),
    ("progress_percent", _DATA, "progress_percent", None),
    ("current_phase", _DATA, "current_phase", None),
    (
        "resumed_from_checkpoint_id",
        _DATA,
        "resumed_from_checkpoint_id",
        (_META, "resumed_from_checkpoint_id"),
    ),
    ("reason", _DATA, "reason", None),
    ("control_type", _DATA, "control_type", None),
    ("refused_event_id", _DATA, "refused_event_id", None),
    ("circuit_name", _DATA, "circuit_name", None),
    ("circuit_state", _DATA, "state", None),
    ("lifecycle_state", _DATA, "lifecycle_state", None),
    ("previous_state", _DATA, "previous_state", None),
    ("sunset_date", _DATA, "sunset_date", None),
    ("deprecated_in_favor_of", _DATA, "deprecated_in_favor_of", None),
    ("retry_after_s", _DATA, "retry_after_s", None),
    ("expires_at", _DATA, "expires_at", None),
    ("retryable", _ERROR, "retryable", None),
)

#: What pydantic makes of a value in JSON mode (an ``Any`` field): for the rare value
#: that is not already plain JSON (an ``IntEnum``, ``inf``, a tuple ...).
_AS_JSON: Final = TypeAdapter[Any](Any)
_UTC_SUFFIX: Final = "+00:00"
#: What :func:`_scalar` returns for a value the record leaves out.
_OMIT: Final = object()


def audit_event(parent: Envelope, *, topic: str, now: datetime) -> Envelope:
    """The audit event for ``parent``: same type, deterministic id, same trace."""
    audit_id = derived_event_id(parent, parent.type)
    data = _record_data(parent, topic=topic, audit_id=audit_id, now=now)
    verified = parent.type not in _UNVERIFIED_AUTH
    return new_event(
        # The audit event keeps the source type even when toolfleet does not know it.
        event_type=cast(EventType, parent.type),
        source=Source.AUDIT,
        data=data,
        tenant_id=data["tenant_id"] or "",
        invocation_id=data["invocation_id"],
        event_id=data["audit_id"],
        traceparent=parent.traceparent,
        tracestate=parent.tracestate,
        authtype=parent.authtype if verified else None,
        authid=parent.authid if verified else None,
    )


def audit_record(event: Envelope, *, topic: str, audit_id: str, now: datetime) -> AuditRecord:
    """The PII-safe audit record of one lifecycle event, with its OCSF projection."""
    return AuditRecord.model_validate(_record_data(event, topic=topic, audit_id=audit_id, now=now))


def _record_data(event: Envelope, *, topic: str, audit_id: str, now: datetime) -> dict[str, Any]:
    """The audit record as ``AuditRecord.model_dump(mode="json")`` would give it."""
    data = event.data
    event_type = event.type
    agent = _dict(data.get("agent_context"))
    outcome, status, error_code = _shape(event_type, data)
    agent_did = _text(agent.get("agent_did")) or _text(data.get("agent_did"))
    actor_key = _ACTOR_KEY.get(event_type)
    occurred_at = event.time or now
    record: dict[str, Any] = {
        "audit_id": audit_id,
        "event_type": event_type,
        "occurred_at": _json_time(occurred_at),
        "tenant_id": tenant_of(event),
        "invocation_id": invocation_id_of(event),
        "agent_did": agent_did,
        "user_did": _text(agent.get("user_did")),
        "tool_id": _text(data.get("tool_id")),
        "tool_version": _text(data.get("tool_version")),
        "action": event_type.removeprefix("ai.agent."),
        "outcome": outcome,
        "status": status,
        "error_code": error_code,
        "actor": agent_did if actor_key is None else _text(data.get(actor_key)),
        "auth": _auth(event),
        "parameters": _parameters(event_type, data),
        "trace_id": trace_id_of(event.traceparent),
        "source_event": {
            "source": event.source,
            "id": event.id,
            "type": event_type,
            "topic": topic,
        },
    }
    record["ocsf"] = ocsf.api_activity(
        record,
        occurred_at=occurred_at,
        source_app=event.source,
        logged_at=now,
        details=_details(data),
        error_message=_error_message(data),
    )
    return record


def _shape(event_type: str, data: Mapping[str, Any]) -> tuple[Outcome, str | None, str | None]:
    """``(outcome, status, error_code)`` of an event."""
    if event_type in TERMINAL_TYPES:
        status = _text(data.get("status"))
        code = _text(_dict(data.get("error")).get("code"))
        return ("success" if status == "success" else "failure"), status, code
    if event_type == EventType.EGRESS:
        allowed = data.get("decision") == "allowed"
        return ("success", None, None) if allowed else ("failure", None, "permission_denied")
    outcome, status = _SHAPE.get(event_type, ("info", None))
    return outcome, status, _CODE_OF_TYPE.get(event_type)


def _auth(event: Envelope) -> dict[str, str]:
    if event.type in _UNVERIFIED_AUTH:
        return {}
    auth: dict[str, str] = {}
    if event.authtype:
        auth["authtype"] = event.authtype
    if event.authid:
        auth["authid"] = event.authid
    return auth


def _parameters(event_type: str, data: Mapping[str, Any]) -> dict[str, Any] | None:
    if event_type not in _WITH_PARAMETERS:
        return None
    parameters = data.get("parameters")
    if not isinstance(parameters, Mapping):
        return {}
    sanitized = mask_parameters(parameters)
    return (
        sanitized
        if _is_json(sanitized)
        else cast(dict[str, Any], _AS_JSON.dump_python(sanitized, mode="json"))
    )


def _details(data: Mapping[str, Any]) -> dict[str, Any]:
    """Metadata worth a SIEM's time, never a result body, parameters or a token."""
    sources = (
        data,
        _dict(data.get("execution_metadata")),
        _dict(data.get("execution_options")),
        _dict(data.get("error")),
    )
    picked: dict[str, Any] = {}
    for name, where, key, fallback in _DETAILS:
        source = sources[where]
        if key in source:
            value = source[key]
        elif fallback is not None:
            value = sources[fallback[0]].get(fallback[1])
        else:
            continue
        if value is not None and (value := _scalar(value)) is not _OMIT:
            picked[name] = value
    if (warnings := data.get("warnings")) and (value := _scalar(warnings)) is not _OMIT:
        picked["warnings"] = value
    if documents := data.get("documents_accessed"):
        accessed = [
            f"{d.get('document_id')}@{d.get('version')}:{d.get('access')}"
            for d in documents
            if isinstance(d, dict)
        ]
        if accessed and (value := _scalar(accessed)) is not _OMIT:
            picked["documents_accessed"] = value
    return picked


def _scalar(value: Any) -> Any:
    """JSON scalars only (strings masked and clipped); lists of strings masked too.

    :data:`_OMIT` for anything else. A number JSON cannot hold (``inf``) is kept as
    ``None``, which pydantic writes as JSON ``null``.
    """
    kind = type(value)
    if kind is str:
        return mask_text(value[:_MAX_TEXT])
    if kind is int or kind is bool or (kind is float and math.isfinite(value)):
        return value
    if isinstance(value, bool | int | float):
        return _AS_JSON.dump_python(value, mode="json")
    if isinstance(value, str):
        return mask_text(value[:_MAX_TEXT])
    if isinstance(value, list):
        texts = [mask_text(v[:_MAX_TEXT]) for v in value[:32] if isinstance(v, str)]
        return texts or _OMIT
    return _OMIT


def _is_json(value: Any) -> bool:
    """Whether ``value`` is plain JSON already (what pydantic would dump unchanged)."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is dict:
        return all(type(k) is str and _is_json(v) for k, v in value.items())
    if kind is list:
        return all(_is_json(v) for v in value)
    return False


def _json_time(moment: datetime) -> str:
    """``moment`` as pydantic writes a datetime in JSON mode (``Z`` for UTC)."""
    text = moment.isoformat()
    if type(moment) is datetime:
        if text.endswith(_UTC_SUFFIX):
            return text[: -len(_UTC_SUFFIX)] + "Z"
        # Naive, or an offset in whole minutes ("+02:00"): isoformat's is pydantic's.
        if moment.tzinfo is None or (text[-6] in "+-" and text[-3] == ":"):
            return text
    return cast(str, _AS_JSON.dump_python(moment, mode="json"))


def _error_message(data: Mapping[str, Any]) -> str | None:
    message = _text(_dict(data.get("error")).get("message"))
    return mask_text(message) if message else None


def _text(value: Any) -> str | None:
    return value[:_MAX_TEXT] if isinstance(value, str) and value else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
