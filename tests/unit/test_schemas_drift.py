"""``schemas/`` is generated from the models; this fails when the two drift."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
import yaml
from pydantic import BaseModel

from toolfleet.cli import schemas as schema_files
from toolfleet.contract import schema_export
from toolfleet.errors import ErrorCode, ErrorInfo
from toolfleet.events.codec import ContentMode, encode
from toolfleet.events.envelope import new_event
from toolfleet.events.models import (
    AgentContext,
    AnomalyDetected,
    ApprovalDecision,
    ApprovalRequested,
    AuditRecord,
    CancelRequested,
    CheckpointCreated,
    CircuitChanged,
    ControlRefused,
    DlqHeader,
    DlqRecord,
    Effect,
    EgressDecided,
    ExecutionMetadata,
    InvocationStatus,
    InvokeAuthorized,
    InvokeExecuted,
    InvokeQueued,
    InvokeRequested,
    OutcomeRefusalKind,
    OutcomeRefused,
    SourceEventRef,
    SourceToolAdded,
    ToolInvoked,
    ToolLifecycleChanged,
    ToolOutcome,
)
from toolfleet.events.types import EventType

pytestmark = pytest.mark.unit

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
NOW = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
INVOCATION = uuid.UUID("0b9f4c1e-6d5a-4a53-9c1e-3f2d8e7a6b5c")
AGENT = AgentContext(agent_did="did:agent:x", tenant_id="tenant_acme")

RENDERED = schema_export.render()


def _outcome(status: InvocationStatus) -> ToolOutcome:
    error = (
        None
        if status is InvocationStatus.SUCCESS
        else ErrorInfo(code=ErrorCode.TIMEOUT, message="safe text", retryable=True)
    )
    return ToolOutcome(
        invocation_id=INVOCATION,
        status=status,
        agent_did="did:agent:x",
        tenant_id="tenant_acme",
        tool_id="core__echo",
        tool_version="1.0.0",
        result={"message": "hi"} if error is None else None,
        error=error,
        execution_metadata=ExecutionMetadata(duration_ms=3, started_at=NOW, completed_at=NOW),
    )


def sample(event_type: EventType) -> BaseModel:
    """A valid ``data`` model for every event type."""
    match event_type:
        case EventType.INVOKE_REQUESTED:
            return InvokeRequested(
                invocation_id=INVOCATION,
                tool_id="core__echo",
                agent_context=AGENT,
                parameters={"message": "hi"},
                capability_token="a.b.c",
            )
        case EventType.INVOKE_AUTHORIZED:
            return InvokeAuthorized(
                invocation_id=INVOCATION,
                tool_id="core__echo",
                tool_version="1.0.0",
                requested_version="*",
                agent_context=AGENT,
                parameters={"message": "hi"},
                effect=Effect.READ_ONLY,
                timeout_seconds=5,
                requested_at=NOW,
            )
        case EventType.INVOKE_QUEUED:
            return InvokeQueued(
                invocation_id=INVOCATION,
                tenant_id="tenant_acme",
                agent_did="did:agent:x",
                tool_id="acme__render",
                tool_version="1.0.0",
                pool="gpu",
                reason="no_live_executor",
                deadline=NOW,
                at=NOW,
            )
        case EventType.INVOKE_EXECUTED:
            return InvokeExecuted(
                invocation_id=INVOCATION,
                tool_id="core__echo",
                tool_version="1.0.0",
                agent_context=AGENT,
                result={"message": "hi", "length": 2},
                execution_metadata=ExecutionMetadata(started_at=NOW),
            )
        case EventType.SUCCEEDED:
            return _outcome(InvocationStatus.SUCCESS)
        case EventType.FAILED:
            return _outcome(InvocationStatus.PERMISSION_DENIED)
        case EventType.TIMEOUT:
            return _outcome(InvocationStatus.TIMEOUT)
        case EventType.CANCELLED:
            return _outcome(InvocationStatus.CANCELLED)
        case EventType.INVOKED:
            return ToolInvoked(
                invocation_id=INVOCATION,
                tenant_id="tenant_acme",
                agent_did="did:agent:x",
                tool_id="core__echo",
                tool_version="1.0.0",
                worker_id="host-1",
                started_at=NOW,
            )
        case EventType.CHECKPOINT_CREATED:
            return CheckpointCreated(
                invocation_id=INVOCATION,
                tenant_id="tenant_acme",
                tool_id="core__long_running",
                checkpoint_id="cp1",
                progress_percent=50,
                timestamp=NOW,
            )
        case EventType.CONTROL_REFUSED:
            return ControlRefused(
                invocation_id=INVOCATION,
                tenant_id="tenant_acme",
                control_type=EventType.APPROVAL_GRANTED,
                actor="did:user:alice",
                reason="control event is not signed",
                refused_event_id="e1",
            )
        case EventType.OUTCOME_REFUSED:
            return OutcomeRefused(
                invocation_id=str(INVOCATION),
                tenant_id="tenant_acme",
                outcome_type=EventType.SUCCEEDED,
                claimed_status="success",
                actor="/toolfleet/validator",
                refusal=OutcomeRefusalKind.UNSIGNED,
                reason="outcome is not signed",
                refused_event_id="e1",
                refused_by="status",
            )
        case EventType.APPROVAL_REQUESTED:
            return ApprovalRequested(
                invocation_id=INVOCATION,
                tenant_id="tenant_acme",
                agent_did="did:agent:x",
                tool_id="core__echo",
                tool_version="1.0.0",
                effect=Effect.EXTERNAL_SIDE_EFFECT,
                reason="policy",
                parameters_hash="0" * 64,
                expires_at=NOW,
            )
        case EventType.EGRESS:
            return EgressDecided(
                invocation_id=INVOCATION,
                tenant_id="t1",
                host="api.example.com",
                port=443,
                method="CONNECT",
                decision="refused",
                reason="not_granted",
                at=NOW,
            )
        case EventType.CIRCUIT_OPENED | EventType.CIRCUIT_CLOSED:
            return CircuitChanged(circuit_name="api.example", state="open", at=NOW)
        case EventType.TOOL_LIFECYCLE_CHANGED:
            return ToolLifecycleChanged(
                tool_id="core__echo",
                tool_version="1.0.0",
                previous_state="active",
                lifecycle_state="deprecated",
                operator="ops@example.com",
                sunset_date=NOW,
                deprecated_in_favor_of="2.0.0",
                at=NOW,
            )
        case EventType.SOURCE_TOOL_ADDED:
            return SourceToolAdded(
                source="github",
                source_tenant_id="*",
                tool_id="mcp__github__late",
                tool_version="1.0.0+h0123456789ab",
                at=NOW,
            )
        case EventType.CANCEL_REQUESTED:
            return CancelRequested(invocation_id=INVOCATION, tenant_id="tenant_acme")
        case EventType.APPROVAL_GRANTED | EventType.APPROVAL_DENIED:
            return ApprovalDecision(invocation_id=INVOCATION, tenant_id="tenant_acme")
        case EventType.DLQ_RECORD:
            return DlqRecord(
                topic="toolfleet.invoke.requested",
                partition=3,
                offset=42,
                key_b64="dA==",
                headers=[DlqHeader(key="ce_id", value_b64="eA==")],
                value_b64="e30=",
                consumer_group="toolfleet.policy",
                error=ErrorInfo(code=ErrorCode.INVALID_EVENT, message="bad"),
                failed_at=NOW,
            )
        case EventType.ANOMALY:
            return AnomalyDetected(
                anomaly_id="f1",
                kind="denial_spike",
                tenant_id="tenant_acme",
                agent_did="did:agent:x",
                window_start=NOW,
                window_end=NOW,
                observed=10,
                threshold=10,
                summary="agent did:agent:x was denied 10 times in one minute",
                detected_at=NOW,
                ocsf={"class_uid": 2004},
            )
    raise AssertionError(f"no sample for {event_type}")


AUDIT_SAMPLE = AuditRecord(
    audit_id="a1",
    event_type=EventType.SUCCEEDED,
    occurred_at=NOW,
    tenant_id="tenant_acme",
    invocation_id=str(INVOCATION),
    action="tool.succeeded",
    outcome="success",
    source_event=SourceEventRef(
        source="/toolfleet/validator", id="e1", type=EventType.SUCCEEDED, topic="t"
    ),
    ocsf={"class_uid": 6003},
)


def _validator(path: str) -> Any:
    return jsonschema_rs.Draft202012Validator(json.loads(RENDERED[path]))


def test_checked_in_schemas_match_the_models() -> None:
    drifted = schema_files.drift(SCHEMAS)
    assert not drifted, f"schemas/ drifted from the models: {drifted}; run `make schemas`"


def test_render_is_deterministic() -> None:
    assert schema_export.render() == RENDERED


def test_every_event_type_has_a_schema() -> None:
    expected = {f"events/{t.value}.json" for t in EventType}
    expected |= {"events/audit.json", "envelope.json", "asyncapi.yaml", "manifest.json"}
    assert set(RENDERED) == expected


@pytest.mark.parametrize("path", sorted(p for p in RENDERED if p.endswith(".json")))
def test_schema_compiles_and_is_identified(path: str) -> None:
    schema = json.loads(RENDERED[path])
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith(path)
    assert schema["title"]
    assert schema["description"]
    jsonschema_rs.meta.validate(schema)
    jsonschema_rs.Draft202012Validator(schema)


@pytest.mark.parametrize("event_type", list(EventType), ids=str)
def test_sample_event_validates(event_type: EventType) -> None:
    data = sample(event_type).model_dump(mode="json")
    validator = _validator(schema_export.event_schema_path(event_type))
    assert validator.is_valid(data), [e.message for e in validator.iter_errors(data)]


def test_audit_sample_validates() -> None:
    data = AUDIT_SAMPLE.model_dump(mode="json")
    assert _validator("events/audit.json").is_valid(data)


def test_inbound_schema_rejects_unknown_fields() -> None:
    data = sample(EventType.INVOKE_REQUESTED).model_dump(mode="json")
    data["execution_options"]["require_aproval"] = True
    assert not _validator("events/ai.agent.tool.invoke.requested.json").is_valid(data)


def test_terminal_schemas_pin_their_statuses() -> None:
    success = _outcome(InvocationStatus.SUCCESS).model_dump(mode="json")
    assert not _validator("events/ai.agent.tool.failed.json").is_valid(success)
    assert _validator("events/ai.agent.tool.succeeded.json").is_valid(success)


@pytest.mark.parametrize("mode", list(ContentMode))
def test_envelope_schema_accepts_what_the_codec_emits(mode: ContentMode) -> None:
    envelope = new_event(
        event_type=EventType.SUCCEEDED,
        source="/toolfleet/validator",
        data=sample(EventType.SUCCEEDED),
        tenant_id="tenant_acme",
        invocation_id=str(INVOCATION),
        traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01",
    )
    validator = _validator("envelope.json")
    structured = json.loads(encode(envelope, ContentMode.STRUCTURED).value)
    assert validator.is_valid(structured), [e.message for e in validator.iter_errors(structured)]
    if mode is ContentMode.BINARY:
        wire = encode(envelope, mode)
        doc = yaml.safe_load(RENDERED["asyncapi.yaml"])
        headers_schema = doc["components"]["schemas"]["binaryModeHeaders"]
        headers = {k: v.decode() for k, v in wire.headers}
        assert jsonschema_rs.Draft202012Validator(headers_schema).is_valid(headers)
    assert not validator.is_valid({**structured, "specversion": "0.3"})


def _resolve(doc: dict[str, Any], pointer: str) -> Any:
    node: Any = doc
    for part in pointer.lstrip("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return found + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_asyncapi_document_is_complete_and_its_refs_resolve() -> None:
    doc = yaml.safe_load(RENDERED["asyncapi.yaml"])
    assert doc["asyncapi"] == "3.0.0"
    assert set(doc["servers"]) == {"dev", "prod"}
    addresses = {c["address"] for c in doc["channels"].values()}
    pools = "toolfleet.invoke.authorized.{pool}"  # every executor pool's topic but default's
    assert addresses == {f"toolfleet.{name}" for name in schema_export.TOPIC_DOCS} | {pools}
    for channel in doc["channels"].values():
        assert channel["bindings"]["kafka"]["partitions"] == 12
    names = {m["name"] for m in doc["components"]["messages"].values()}
    assert {t.value for t in EventType} <= names
    for ref in _refs(doc):
        if ref.startswith("#/"):
            _resolve(doc, ref)
        else:
            assert ref.removeprefix("./") in RENDERED, ref
    for op in doc["operations"].values():
        assert op["action"] in {"send", "receive"}
    senders = {
        op["tags"][0]["name"]
        for op in doc["operations"].values()
        if op["action"] == "send"
        and op["channel"]["$ref"]
        in {"#/channels/invokeAuthorized", "#/channels/invokeAuthorizedPool"}
    }
    # Policy authorizes; an executor only hands a call it lacks the tool for (policy's
    # grant unchanged) to one of its pool that has it.
    assert senders == {"policy", "executor"}


def test_the_schemas_command_writes_checks_and_removes_stale_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert schema_files.main(["--check", str(tmp_path)]) == 1
    assert "differ from the models" in capsys.readouterr().err
    assert schema_files.main([str(tmp_path)]) == 0
    assert schema_files.drift(tmp_path) == []
    assert schema_files.main(["--check", str(tmp_path)]) == 0
    stale = tmp_path / "events" / "ai.agent.tool.retired.json"
    stale.write_text("{}", encoding="utf-8")
    (tmp_path / "asyncapi.yaml").write_text("edited by hand\n", encoding="utf-8")
    assert set(schema_files.drift(tmp_path)) == {
        "asyncapi.yaml",
        "events/ai.agent.tool.retired.json",
    }
    assert schema_files.main([str(tmp_path)]) == 0
    assert not stale.exists()
    assert (tmp_path / "asyncapi.yaml").read_text(encoding="utf-8") == RENDERED["asyncapi.yaml"]


def test_a_tool_manifest_validates_against_the_published_manifest_schema() -> None:
    from toolfleet.sdk import spec_of
    from toolfleet.sdk.builtin import echo

    data = spec_of(echo).manifest().model_dump(mode="json")
    validator = _validator("manifest.json")
    assert validator.is_valid(data), [e.message for e in validator.iter_errors(data)]
    assert not validator.is_valid({**data, "category": "not-a-category"})
