"""The OCSF 1.8 API Activity (class 6003) projection of an audit record.

Every lifecycle event is one fact about one API call (the tool invocation), so all of
them map to API Activity in the Application Activity category (6). The activity says
what the event did to the invocation, seen as an API resource:

=================================================  ===============  =================
event type                                          activity_id      activity_name
=================================================  ===============  =================
``ai.agent.tool.invoke.requested``                  1 Create         Create
authorized, approval requested/granted/denied,      3 Update         Update
invoked, checkpoint created, executed, the four
terminal outcomes, cancel requested
``ai.agent.circuit.opened|closed`` and any type     99 Other         the event's action
toolfleet does not know                                              (``circuit.opened``)
=================================================  ===============  =================

``type_uid`` is ``600300 + activity_id``. ``status_id`` is 1 Success / 2 Failure for
the record's outcome and 0 Unknown for ``pending`` and ``info``. Severity is 1
Informational, 2 Low for failures, 3 Medium for denials (``permission_denied``,
``approval_denied``) and an opened circuit. ``metadata.uid`` is the audit event's id
and ``metadata.original_event_uid`` the source event's (OCSF 1.7+ semantics);
``metadata.correlation_uid`` is the invocation id, so a SIEM can group one call.
Everything without an OCSF attribute (the toolfleet status, trace id, auth context,
durations, attempts ...) goes under ``unmapped``. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from toolfleet.events.types import EventType

OCSF_VERSION: Final = "1.8.0"
CATEGORY_UID: Final = 6
CLASS_UID: Final = 6003
PRODUCT: Final = "toolfleet"

ACTIVITY_CREATE: Final = 1
ACTIVITY_UPDATE: Final = 3
ACTIVITY_OTHER: Final = 99
_ACTIVITY_NAMES: Final = {ACTIVITY_CREATE: "Create", ACTIVITY_UPDATE: "Update"}

_UPDATES: Final = frozenset(
    {
        EventType.INVOKE_AUTHORIZED,
        EventType.INVOKE_EXECUTED,
        EventType.SUCCEEDED,
        EventType.FAILED,
        EventType.TIMEOUT,
        EventType.CANCELLED,
        EventType.INVOKED,
        EventType.CHECKPOINT_CREATED,
        EventType.APPROVAL_REQUESTED,
        EventType.INVOKE_QUEUED,
        EventType.CANCEL_REQUESTED,
        EventType.APPROVAL_GRANTED,
        EventType.APPROVAL_DENIED,
        EventType.CONTROL_REFUSED,
        EventType.OUTCOME_REFUSED,
    }
)

_STATUS: Final = {"success": (1, "Success"), "failure": (2, "Failure")}
_SEVERITY_NAMES: Final = {1: "Informational", 2: "Low", 3: "Medium"}
_SECURITY_CODES: Final = frozenset({"permission_denied", "approval_denied"})


def activity_of(event_type: str) -> tuple[int, str]:
    """``(activity_id, activity_name)`` of an event type (see the module table)."""
    if event_type == EventType.INVOKE_REQUESTED:
        return ACTIVITY_CREATE, _ACTIVITY_NAMES[ACTIVITY_CREATE]
    if event_type in _UPDATES:
        return ACTIVITY_UPDATE, _ACTIVITY_NAMES[ACTIVITY_UPDATE]
    return ACTIVITY_OTHER, event_type.removeprefix("ai.agent.")


def _classification(activity_id: int, activity_name: str) -> dict[str, Any]:
    return {
        "activity_id": activity_id,
        "activity_name": activity_name,
        "category_uid": CATEGORY_UID,
        "category_name": "Application Activity",
        "class_uid": CLASS_UID,
        "class_name": "API Activity",
        "type_uid": CLASS_UID * 100 + activity_id,
        "type_name": f"API Activity: {activity_name}",
    }


#: The first members of the projection, which depend on the event type alone (copied).
_CLASSIFICATION: Final = {t.value: _classification(*activity_of(t)) for t in EventType}


def severity_of(record: Mapping[str, Any]) -> int:
    """Severity of an audit record (its JSON fields, as in :func:`api_activity`)."""
    if record["error_code"] in _SECURITY_CODES or record["status"] == "permission_denied":
        return 3
    if record["event_type"] == EventType.CIRCUIT_OPENED:
        return 3
    return 2 if record["outcome"] == "failure" else 1


def epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def api_activity(
    record: Mapping[str, Any],
    *,
    occurred_at: datetime,
    source_app: str,
    logged_at: datetime,
    details: Mapping[str, Any] | None = None,
    error_message: str | None = None,
) -> dict[str, Any]:
    """The OCSF API Activity event for ``record``.

    Args:
        record: The audit record's JSON fields (:class:`~toolfleet.events.models.AuditRecord`
            dumped in JSON mode); its own ``ocsf`` member, if any, is ignored.
        occurred_at: The record's ``occurred_at`` as a datetime (``time``,
            ``metadata.original_time``).
        source_app: ``source`` of the lifecycle event: the service or client that
            produced it (``actor.app_name``, ``src_endpoint.svc_name``).
        logged_at: When audit processed it (``metadata.logged_time``).
        details: Already-sanitized JSON metadata without an OCSF home, copied to
            ``unmapped`` as it is (a ``None`` is kept as JSON ``null``);
            ``duration_ms`` also becomes ``duration``.
        error_message: Already-masked error text (``status_detail``).
    """
    details = details or {}
    event_type = record["event_type"]
    classification = _CLASSIFICATION.get(event_type)
    event = (
        classification.copy()
        if classification is not None
        else _classification(*activity_of(event_type))
    )
    status_id, status = _STATUS.get(record["outcome"], (0, "Unknown"))
    severity_id = severity_of(record)
    error_code = record["error_code"]
    tool_id = record["tool_id"]
    event["time"] = epoch_ms(occurred_at)
    event["severity_id"] = severity_id
    event["severity"] = _SEVERITY_NAMES[severity_id]
    event["status_id"] = status_id
    event["status"] = status
    event["message"] = _message(record)
    event["api"] = _api(record, error_message)
    event["actor"] = _actor(record, source_app)
    event["src_endpoint"] = {"svc_name": source_app}
    event["cloud"] = {"provider": PRODUCT}
    event["metadata"] = _metadata(record, occurred_at, logged_at)
    event["unmapped"] = _unmapped(record, details)
    if error_code:
        event["status_code"] = error_code
    if error_message:
        event["status_detail"] = error_message
    if isinstance(details.get("duration_ms"), int):
        event["duration"] = details["duration_ms"]
    if tool_id:
        resource: dict[str, Any] = {"uid": tool_id, "type": "tool"}
        if record["tool_version"]:
            resource["version"] = record["tool_version"]
        event["resources"] = [resource]
    return event


def _message(record: Mapping[str, Any]) -> str:
    subject = f" {record['tool_id']}" if record["tool_id"] else ""
    status = f" ({record['status']})" if record["status"] else ""
    return f"{record['action']}{subject}{status}"


def _api(record: Mapping[str, Any], error_message: str | None) -> dict[str, Any]:
    api: dict[str, Any] = {"operation": record["event_type"], "service": {"name": PRODUCT}}
    if record["invocation_id"]:
        api["request"] = {"uid": record["invocation_id"]}
    if record["error_code"]:
        response: dict[str, Any] = {"error": record["error_code"]}
        if error_message:
            response["error_message"] = error_message
        api["response"] = response
    return api


def _actor(record: Mapping[str, Any], source_app: str) -> dict[str, Any]:
    actor: dict[str, Any] = {"app_name": source_app}
    uid = record["actor"]
    if uid:
        actor["user"] = (
            {"uid": uid, "type": "agent", "type_id": 99}
            if uid == record["agent_did"]
            else {"uid": uid, "type": "User", "type_id": 1}
        )
    return actor


def _metadata(
    record: Mapping[str, Any], occurred_at: datetime, logged_at: datetime
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "version": OCSF_VERSION,
        "product": {"name": PRODUCT, "vendor_name": PRODUCT},
        "uid": record["audit_id"],
        "original_event_uid": record["source_event"]["id"],
        "event_code": record["event_type"],
        "log_name": "audit",
        "original_time": occurred_at.isoformat(),
        "logged_time": epoch_ms(logged_at),
    }
    if record["invocation_id"]:
        metadata["correlation_uid"] = record["invocation_id"]
    if record["tenant_id"]:
        metadata["tenant_uid"] = record["tenant_id"]
    return metadata


def _unmapped(record: Mapping[str, Any], details: Mapping[str, Any]) -> dict[str, Any]:
    unmapped: dict[str, Any] = {
        "action": record["action"],
        "outcome": record["outcome"],
        "source_event": dict(record["source_event"]),
    }
    for name in ("status", "trace_id", "user_did", "agent_did"):
        if record[name] is not None:
            unmapped[name] = record[name]
    if record["auth"]:
        unmapped["auth"] = dict(record["auth"])
    unmapped.update(details)
    return unmapped
