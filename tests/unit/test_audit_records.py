"""Audit records and their OCSF projection, from lifecycle events (no broker)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from tests.support.lifecycle import T0, Lifecycle
from toolfleet.audit import ocsf
from toolfleet.audit.records import audit_event
from toolfleet.errors import ErrorCode
from toolfleet.events.codec import ContentMode, decode, encode
from toolfleet.events.envelope import Envelope, derived_event_id, new_event
from toolfleet.events.identity import invocation_uuid
from toolfleet.events.models import (
    AuditRecord,
    CircuitChanged,
    ControlRefused,
    InvocationStatus,
)
from toolfleet.events.types import EventType, Source

pytestmark = pytest.mark.unit

NOW = datetime(2025, 1, 1, 13, 0, tzinfo=UTC)
TOPIC = "toolfleet.invoke.results"


def _audit(event: Envelope) -> tuple[Envelope, AuditRecord]:
    env = audit_event(event, topic=TOPIC, now=NOW)
    return env, AuditRecord.model_validate(env.data)


def _every_event(lc: Lifecycle) -> list[Envelope]:
    return [
        lc.requested(),
        lc.authorized(),
        lc.approval_requested(),
        lc.approval(granted=True),
        lc.approval(granted=False),
        lc.invoked(),
        lc.checkpoint(40, "fetching"),
        lc.executed(),
        lc.cancel_requested(),
        lc.outcome(InvocationStatus.SUCCESS),
        lc.outcome(InvocationStatus.ERROR),
        lc.outcome(InvocationStatus.TIMEOUT, code=ErrorCode.TIMEOUT),
        lc.outcome(InvocationStatus.CANCELLED, code=ErrorCode.CANCELLED),
    ]


def test_envelope_keeps_type_trace_and_tenant_with_a_deterministic_id() -> None:
    lc = Lifecycle()
    for event in _every_event(lc):
        env, record = _audit(event)
        assert env.type == event.type
        assert env.source == Source.AUDIT
        assert env.id == derived_event_id(event, event.type) == record.audit_id
        assert audit_event(event, topic=TOPIC, now=NOW).id == env.id  # redelivery collapses
        assert env.tenantid == env.partitionkey == lc.tenant
        assert env.invocationid == env.subject == lc.invocation_id
        assert env.traceparent == lc.traceparent
        assert record.trace_id == lc.traceparent[3:35]
        assert record.source_event.id == event.id
        assert record.source_event.topic == TOPIC


def test_structured_round_trip() -> None:
    env, _ = _audit(Lifecycle().outcome())
    wire = encode(env, ContentMode.STRUCTURED)
    assert dict(wire.headers)["content-type"].startswith(b"application/cloudevents+json")
    assert decode(key=wire.key, value=wire.value, headers=wire.headers) == env


def test_requested_parameters_are_sanitized_and_the_token_is_gone() -> None:
    lc = Lifecycle(
        parameters={
            "query": "mail alice@example.com about it",
            "api_key": "sk-live-123",
            "nested": [{"auth": {"Authorization": "Bearer abc.def.123"}}, "ok"],
        }
    )
    for event in (lc.requested(), lc.authorized()):
        env, record = _audit(event)
        raw = encode(env, ContentMode.STRUCTURED).value.decode()
        for secret in ("alice@example.com", "sk-live-123", "abc.def.123", "eyJhbGciOiJSUzI1NiJ9"):
            assert secret not in raw
        assert "capability_token" not in raw
        assert record.parameters == {
            "query": "mail [REDACTED:email] about it",
            "api_key": "[REDACTED]",
            "nested": [{"auth": "[REDACTED]"}, "ok"],
        }


def test_unverified_auth_on_requested_is_dropped() -> None:
    event = Lifecycle().requested().model_copy(update={"authtype": "x", "authid": "spoofed"})
    env, record = _audit(event)
    assert record.auth == {}
    assert env.authtype is None
    assert env.authid is None


def test_auth_of_verified_events_is_kept() -> None:
    env, record = _audit(Lifecycle(authid="did:agent:a").authorized())
    assert record.auth == {"authtype": "app_user", "authid": "did:agent:a"}
    assert env.authid == "did:agent:a"


def test_results_never_reach_the_audit_log() -> None:
    lc = Lifecycle()
    for event in (lc.outcome(result={"body": "RESULT-BODY-MARKER"}), lc.executed()):
        env, record = _audit(event)
        raw = json.dumps(env.data)
        assert "RESULT-BODY-MARKER" not in raw
        assert '"length": 2' not in raw
        assert record.parameters is None


@pytest.mark.parametrize(
    ("make", "action", "outcome", "status", "error_code"),
    [
        (lambda lc: lc.requested(), "tool.invoke.requested", "pending", "pending", None),
        (lambda lc: lc.authorized(), "tool.invoke.authorized", "success", "pending", None),
        (
            lambda lc: lc.approval_requested(),
            "tool.approval.requested",
            "pending",
            "pending_approval",
            None,
        ),
        (lambda lc: lc.approval(granted=True), "tool.approval.granted", "success", None, None),
        (
            lambda lc: lc.approval(granted=False),
            "tool.approval.denied",
            "failure",
            None,
            "approval_denied",
        ),
        (lambda lc: lc.invoked(), "tool.invoked", "info", "running", None),
        (lambda lc: lc.outcome(), "tool.succeeded", "success", "success", None),
        (
            lambda lc: lc.outcome(InvocationStatus.ERROR),
            "tool.failed",
            "failure",
            "error",
            "tool_execution_error",
        ),
        (
            lambda lc: lc.outcome(InvocationStatus.TIMEOUT, code=ErrorCode.TIMEOUT),
            "tool.timeout",
            "failure",
            "timeout",
            "timeout",
        ),
    ],
)
def test_action_outcome_status(make, action, outcome, status, error_code) -> None:  # type: ignore[no-untyped-def]
    _, record = _audit(make(Lifecycle()))
    assert (record.action, record.outcome, record.status, record.error_code) == (
        action,
        outcome,
        status,
        error_code,
    )


def test_actor_of_control_events_is_the_human() -> None:
    lc = Lifecycle()
    _, granted = _audit(lc.approval(granted=True))
    _, cancel = _audit(lc.cancel_requested())
    assert granted.actor == "did:user:approver"
    assert cancel.actor == "did:user:canceller"
    assert granted.ocsf["actor"]["user"] == {
        "uid": "did:user:approver",
        "type": "User",
        "type_id": 1,
    }
    _, requested = _audit(lc.requested())
    assert requested.ocsf["actor"]["user"]["type"] == "agent"


def test_a_refused_control_event_is_an_audited_security_failure() -> None:
    lc = Lifecycle()
    forged = lc.approval(granted=True).model_copy(update={"authtype": "app_user", "authid": "x"})
    _, claimed = _audit(forged)
    assert claimed.auth == {}  # producer-written: its auth attributes are only claims
    refusal = new_event(
        event_type=EventType.CONTROL_REFUSED,
        source=Source.POLICY,
        data=ControlRefused(
            invocation_id=forged.data["invocation_id"],
            tenant_id=forged.data["tenant_id"],
            control_type=forged.type,
            actor="did:user:approver",
            reason="control event is not signed",
            refused_event_id=forged.id,
        ),
        tenant_id=forged.data["tenant_id"],
        invocation_id=forged.data["invocation_id"],
    )
    _, record = _audit(refusal)
    assert (record.outcome, record.error_code, record.actor) == (
        "failure",
        "permission_denied",
        "did:user:approver",
    )
    assert record.ocsf["status_id"] == 2
    assert record.ocsf["severity_id"] == 3
    assert record.ocsf["unmapped"]["reason"] == "control event is not signed"
    assert record.ocsf["unmapped"]["refused_event_id"] == forged.id


def test_ocsf_api_activity_projection() -> None:
    lc = Lifecycle()
    _, record = _audit(lc.outcome(InvocationStatus.ERROR))
    event = record.ocsf
    assert event["class_uid"] == 6003
    assert event["category_uid"] == 6
    assert event["activity_id"] == 3
    assert event["type_uid"] == 600303
    assert event["status_id"] == 2
    assert event["status"] == "Failure"
    assert event["status_code"] == "tool_execution_error"
    assert event["severity_id"] == 2
    assert event["time"] == int((T0.timestamp() + 6) * 1000)
    assert event["api"]["operation"] == EventType.FAILED
    assert event["api"]["service"] == {"name": "toolfleet"}
    assert event["api"]["request"] == {"uid": lc.invocation_id}
    assert event["actor"]["user"] == {"uid": lc.agent, "type": "agent", "type_id": 99}
    assert event["actor"]["app_name"] == Source.VALIDATOR
    meta = event["metadata"]
    assert meta["version"] == "1.8.0"
    assert meta["product"] == {"name": "toolfleet", "vendor_name": "toolfleet"}
    assert meta["uid"] == record.audit_id
    assert meta["correlation_uid"] == lc.invocation_id
    assert meta["tenant_uid"] == lc.tenant
    assert meta["original_time"] == record.occurred_at.isoformat()
    assert event["resources"] == [{"uid": lc.tool_id, "type": "tool", "version": lc.version}]
    assert event["duration"] == 1500
    assert event["unmapped"]["attempts"] == 1
    assert event["unmapped"]["cached"] is False
    assert event["unmapped"]["status"] == "error"
    json.dumps(event)


def test_ocsf_activity_mapping() -> None:
    assert ocsf.activity_of(EventType.INVOKE_REQUESTED) == (1, "Create")
    assert ocsf.activity_of(EventType.SUCCEEDED) == (3, "Update")
    assert ocsf.activity_of(EventType.CANCEL_REQUESTED) == (3, "Update")
    assert ocsf.activity_of(EventType.CIRCUIT_OPENED) == (99, "circuit.opened")
    assert ocsf.activity_of("com.example.unknown") == (99, "com.example.unknown")


def test_success_and_pending_status_ids() -> None:
    lc = Lifecycle()
    assert _audit(lc.outcome())[1].ocsf["status_id"] == 1
    assert _audit(lc.requested())[1].ocsf["status_id"] == 0
    denied = _audit(lc.approval(granted=False))[1].ocsf
    assert denied["status_id"] == 2
    assert denied["severity_id"] == 3


def test_circuit_events_have_no_invocation() -> None:
    data = CircuitChanged(circuit_name="api.example", state="open", reason="5 failures", at=T0)
    event = new_event(
        event_type=EventType.CIRCUIT_OPENED,
        source=Source.EXECUTOR,
        data=data,
        tenant_id="t_acme",
        invocation_id=None,
    )
    env, record = _audit(event)
    assert record.invocation_id is None
    assert env.invocationid is None
    assert record.ocsf["activity_id"] == 99
    assert record.ocsf["unmapped"]["circuit_name"] == "api.example"
    assert "request" not in record.ocsf["api"]


def test_malformed_events_are_still_audited() -> None:
    event = Envelope(
        id="x1",
        source="/somewhere",
        type=EventType.INVOKE_REQUESTED,
        tenantid="t1",
        data={"tool_id": 5, "parameters": "not a dict", "agent_context": "nope"},
    )
    _, record = _audit(event)
    assert record.tool_id is None
    assert record.parameters == {}
    assert record.invocation_id == invocation_uuid("x1", tenant_id="t1")


def test_free_text_in_details_is_masked() -> None:
    lc = Lifecycle()
    cancel = lc.cancel_requested()
    cancel = cancel.model_copy(
        update={"data": {**cancel.data, "reason": "call me at bob@example.com"}}
    )
    raw = json.dumps(_audit(cancel)[0].data)
    assert "bob@example.com" not in raw
