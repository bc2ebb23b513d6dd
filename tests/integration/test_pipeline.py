"""Policy, executor and validator together, in-process, on the real broker/Redis/Postgres.

Every assertion is about what a client sees: the terminal outcome of its invocation.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.bus.producer import Outbound
from toolfleet.client import Progress
from toolfleet.events.codec import ContentMode
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration

AGENT = "did:agent:test"


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("pipeline")
    async with in_process_fleet(fleet_settings(settings, home)) as running:
        yield running


async def call(
    fleet: Fleet,
    tool_id: str,
    params: dict[str, Any] | None = None,
    *,
    tenant: str = "t1",
    token: str | None = "auto",  # noqa: S107 - a sentinel, not a password,
    **kw: Any,
) -> ToolOutcome:
    if token == "auto":
        token = fleet.token(tenant)
    return await fleet.client.call(
        tool_id,
        params or {},
        tenant_id=tenant,
        agent_did=AGENT,
        capability_token=token,
        timeout=30,
        **kw,
    )


async def test_success_returns_validated_result(fleet: Fleet) -> None:
    outcome = await call(fleet, "core__echo", {"message": "héllo"})
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result == {"message": "héllo", "length": 5}
    assert outcome.tool_version == "1.0.0"
    assert outcome.error is None
    meta = outcome.execution_metadata
    assert meta.started_at is not None
    assert meta.completed_at is not None
    assert meta.completed_at >= meta.started_at


async def test_current_time_in_a_time_zone(fleet: Fleet) -> None:
    outcome = await call(fleet, "core__get_current_time", {"timezone": "Asia/Tokyo"})
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result is not None
    assert outcome.result["timezone"] == "Asia/Tokyo"
    assert outcome.result["iso"].endswith("+09:00")


@pytest.mark.parametrize(
    ("spec", "expected"), [("^1.0.0", 15), ("~1.0", 1), ("1.0.0", 1), ("*", 2), (">=1.1,<2", 15)]
)
async def test_version_ranges_resolve_to_the_newest_match(
    fleet: Fleet, spec: str, expected: int
) -> None:
    outcome = await call(fleet, "test__versioned", tool_version=spec)
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.result == {"value": expected}


@pytest.mark.parametrize(
    ("tool", "version", "params", "code"),
    [
        ("core__does_not_exist", "*", {}, "tool_not_found"),
        ("core__echo", "^2.0.0", {"message": "x"}, "tool_version_not_found"),
        ("core__echo", "not-a-version", {"message": "x"}, "tool_version_not_found"),
        ("core__echo", "*", {"message": 42}, "invalid_parameters"),
        ("core__echo", "*", {}, "invalid_parameters"),
        ("test__boom", "*", {}, "tool_execution_error"),
        ("test__wrong_output", "*", {}, "result_validation_failed"),
    ],
)
async def test_failures_are_typed_outcomes(
    fleet: Fleet, tool: str, version: str, params: dict[str, Any], code: str
) -> None:
    outcome = await call(fleet, tool, params, tool_version=version)
    assert outcome.status is InvocationStatus.ERROR
    assert outcome.error is not None
    assert outcome.error.code == code


async def test_invalid_parameters_name_the_field(fleet: Fleet) -> None:
    outcome = await call(fleet, "core__echo", {"message": 42})
    assert outcome.error is not None
    fields = [e["field"] for e in outcome.error.details["errors"]]
    assert fields == ["message"]


async def test_tool_exception_message_never_leaves_the_executor(fleet: Fleet) -> None:
    outcome = await call(fleet, "test__boom")
    assert outcome.error is not None
    assert "hunter2" not in outcome.model_dump_json()
    assert "RuntimeError" in outcome.error.message


async def test_timeout(fleet: Fleet) -> None:
    outcome = await call(fleet, "test__sleep", {"seconds": 5})
    assert outcome.status is InvocationStatus.TIMEOUT
    assert outcome.error is not None
    assert outcome.error.code == "timeout"
    assert outcome.error.retryable


async def test_request_timeout_caps_the_tool_timeout(fleet: Fleet) -> None:
    outcome = await call(
        fleet, "core__long_running", {"steps": 5, "step_seconds": 1}, timeout_seconds=0.5
    )
    assert outcome.status is InvocationStatus.TIMEOUT


async def test_redaction_allowlist(fleet: Fleet) -> None:
    outcome = await call(fleet, "test__profile")
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result == {
        "profile": {"name": "Ada", "email": "[REDACTED]", "ssn": "[REDACTED]"},
        "score": 7,
    }


@pytest.mark.parametrize(
    ("tenant", "token_for", "message"),
    [
        ("t1", None, "required"),
        ("t1", {"tenant": "t2"}, "another tenant"),
        ("t1", {"tenant": "t1", "agent": "did:agent:other"}, "another agent"),
        ("t1", {"tenant": "t1", "tool": "core__get_*"}, "does not grant"),
        ("t1", {"tenant": "t1", "ttl_s": -120}, "expired"),
        ("t_denied", {"tenant": "t_denied"}, "policy does not allow"),
    ],
)
async def test_permission_denied(
    fleet: Fleet, tenant: str, token_for: dict[str, Any] | None, message: str
) -> None:
    token = fleet.token(**token_for) if token_for is not None else None
    outcome = await call(fleet, "core__echo", {"message": "x"}, tenant=tenant, token=token)
    assert outcome.status is InvocationStatus.PERMISSION_DENIED
    assert outcome.error is not None
    assert outcome.error.code == "permission_denied"
    assert message in outcome.error.message


async def test_token_signed_by_another_key_is_denied(fleet: Fleet, tmp_path: Path) -> None:
    from toolfleet.auth.keys import generate_key_pair
    from toolfleet.auth.tokens import TokenIssuer

    other = generate_key_pair()
    forged = TokenIssuer(
        other.private_pem, other.public_pem, issuer="toolfleet", audience="toolfleet"
    )
    token = forged.issue(tenant_id="t1", agent_did=AGENT)
    outcome = await call(fleet, "core__echo", {"message": "x"}, token=token)
    assert outcome.status is InvocationStatus.PERMISSION_DENIED


def _request(fleet: Fleet, tenant: str, invocation_id: str, **data: Any) -> dict[str, Any]:
    return {
        "invocation_id": invocation_id,
        "tool_id": "core__echo",
        "agent_context": {"agent_did": AGENT, "tenant_id": tenant},
        "parameters": {"message": "raw"},
        "capability_token": fleet.token(tenant),
        **data,
    }


async def _publish_and_wait(
    fleet: Fleet,
    data: dict[str, Any],
    *,
    key_tenant: str,
    invocation_id: str,
    mode: ContentMode = ContentMode.BINARY,
    event_id: str | None = None,
    copies: int = 1,
) -> ToolOutcome:
    envelope = new_event(
        event_type=EventType.INVOKE_REQUESTED,
        source=Source.CLIENT,
        data=data,
        tenant_id=key_tenant,
        invocation_id=invocation_id,
        event_id=event_id,
    )
    handle = fleet.client.expect(invocation_id, tenant_id=key_tenant)
    for _ in range(copies):
        await fleet.publish(envelope, mode=mode)
    return await fleet.client.wait(handle, timeout=30)


async def test_structured_content_mode_is_accepted(fleet: Fleet) -> None:
    invocation_id = str(uuid.uuid4())
    outcome = await _publish_and_wait(
        fleet,
        _request(fleet, "t1", invocation_id),
        key_tenant="t1",
        invocation_id=invocation_id,
        mode=ContentMode.STRUCTURED,
    )
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result == {"message": "raw", "length": 3}


async def test_malformed_request_gets_invalid_event(fleet: Fleet) -> None:
    invocation_id = str(uuid.uuid4())
    data = _request(fleet, "t1", invocation_id)
    del data["agent_context"]
    data["paramaters"] = {}
    outcome = await _publish_and_wait(fleet, data, key_tenant="t1", invocation_id=invocation_id)
    assert outcome.status is InvocationStatus.ERROR
    assert outcome.error is not None
    assert outcome.error.code == "invalid_event"
    fields = {e["field"] for e in outcome.error.details["errors"]}
    assert {"agent_context", "paramaters"} <= fields


async def test_forged_tenant_key_is_denied(fleet: Fleet) -> None:
    invocation_id = str(uuid.uuid4())
    outcome = await _publish_and_wait(
        fleet, _request(fleet, "t2", invocation_id), key_tenant="t1", invocation_id=invocation_id
    )
    assert outcome.status is InvocationStatus.PERMISSION_DENIED
    assert outcome.tenant_id == "t1"


async def test_duplicate_event_is_processed_once(fleet: Fleet) -> None:
    invocation_id = str(uuid.uuid4())
    outcome = await _publish_and_wait(
        fleet,
        _request(fleet, "t1", invocation_id),
        key_tenant="t1",
        invocation_id=invocation_id,
        event_id=str(uuid.uuid4()),
        copies=3,
    )
    assert outcome.status is InvocationStatus.SUCCESS
    # A later invocation of the same tenant has finished too: the copies had every chance.
    await call(fleet, "core__echo", {"message": "sentinel"})
    executed = await fleet.read(TopicName.EXECUTED, invocation_id=invocation_id)
    results = await fleet.read(TopicName.RESULTS, invocation_id=invocation_id)
    assert len(executed) == 1
    assert len(results) == 1


async def test_a_replayed_executed_event_answers_with_the_same_outcome_id(fleet: Fleet) -> None:
    # The validator keeps no dedupe markers: a redelivery, or a copy someone with topic
    # access sends again, is validated again and answers with the outcome it had, under
    # the same event id, which every reader of the results topic keeps once.
    outcome = await call(fleet, "core__echo", {"message": "once"})
    invocation_id = str(outcome.invocation_id)
    [executed] = await fleet.read(TopicName.EXECUTED, invocation_id=invocation_id)
    [first] = await fleet.read(TopicName.RESULTS, invocation_id=invocation_id)

    async def answered(count: int) -> list[Envelope] | None:
        results = await fleet.read(TopicName.RESULTS, invocation_id=invocation_id)
        return results if len(results) == count else None

    # One copy at a time: two copies in one fetch are one delivery (the in-flight twin).
    for count in (2, 3):
        await fleet.producer.send(
            Outbound(envelope=executed, topic=fleet.topic(TopicName.EXECUTED))
        )
        results = await eventually(functools.partial(answered, count))
    assert {e.id for e in results} == {first.id}
    assert {e.type for e in results} == {first.type}
    expected = {"message": "once", "length": 4}
    assert all(e.data["result"] == first.data["result"] == expected for e in results)


async def test_approval_granted_runs_the_call(fleet: Fleet) -> None:
    seen: list[Progress] = []
    handle = await fleet.client.invoke(
        "core__echo",
        {"message": "ok?"},
        tenant_id="t1",
        agent_did=AGENT,
        capability_token=fleet.token("t1"),
        require_approval=True,
    )
    waiting = asyncio.create_task(fleet.client.wait(handle, timeout=30, on_progress=seen.append))

    async def approval_requested() -> bool:
        return any(p.event_type == EventType.APPROVAL_REQUESTED for p in seen)

    await eventually(approval_requested)
    await fleet.client.approve(handle.invocation_id, tenant_id="t1", approver="alice")
    outcome = await waiting
    assert outcome.status is InvocationStatus.SUCCESS


async def test_approval_denied_and_policy_effects(fleet: Fleet) -> None:
    seen: list[Progress] = []
    handle = await fleet.client.invoke(
        "test__sleep",
        {"seconds": 0},
        tenant_id="t_approval",
        agent_did=AGENT,
        capability_token=fleet.token("t_approval"),
    )
    waiting = asyncio.create_task(fleet.client.wait(handle, timeout=30, on_progress=seen.append))

    async def approval_requested() -> bool:
        return any(p.event_type == EventType.APPROVAL_REQUESTED for p in seen)

    await eventually(approval_requested)
    # a decision sent for another tenant changes nothing
    await fleet.client.deny(handle.invocation_id, tenant_id="t1", approver="mallory")
    await fleet.client.deny(handle.invocation_id, tenant_id="t_approval", approver="bob")
    outcome = await waiting
    assert outcome.status is InvocationStatus.PERMISSION_DENIED
    assert outcome.error is not None
    assert outcome.error.code == "approval_denied"


async def test_cancel_a_running_invocation(fleet: Fleet) -> None:
    seen: list[Progress] = []
    handle = await fleet.client.invoke(
        "core__long_running",
        {"steps": 200, "step_seconds": 0.05},
        tenant_id="t1",
        agent_did=AGENT,
        capability_token=fleet.token("t1"),
    )
    waiting = asyncio.create_task(fleet.client.wait(handle, timeout=30, on_progress=seen.append))

    async def progressing() -> bool:
        return any((p.progress_percent or 0) > 0 for p in seen)

    await eventually(progressing)
    await fleet.client.cancel(handle.invocation_id, tenant_id="t1", requested_by="tester")
    outcome = await waiting
    assert outcome.status is InvocationStatus.CANCELLED
    assert outcome.execution_metadata.checkpoints_created


async def test_cancel_before_it_runs(fleet: Fleet) -> None:
    handle = await fleet.client.invoke(
        "core__echo",
        {"message": "x"},
        tenant_id="t_approval",
        agent_did=AGENT,
        capability_token=fleet.token("t_approval"),
        require_approval=True,
    )
    waiting = asyncio.create_task(fleet.client.wait(handle, timeout=30))
    await asyncio.sleep(0)  # let the watcher see it; the cancel itself is ordered on the topic
    await fleet.client.cancel(handle.invocation_id, tenant_id="t_approval")
    outcome = await waiting
    assert outcome.status is InvocationStatus.CANCELLED


async def test_progress_is_reported_from_checkpoints(fleet: Fleet) -> None:
    seen: list[Progress] = []
    handle = await fleet.client.invoke(
        "core__long_running",
        {"steps": 4, "step_seconds": 0.01},
        tenant_id="t1",
        agent_did=AGENT,
        capability_token=fleet.token("t1"),
    )
    outcome = await fleet.client.wait(handle, timeout=30, on_progress=seen.append)
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result == {"steps_completed": 4, "resumed_from_step": None}
    percents = [p.progress_percent for p in seen if p.event_type == EventType.CHECKPOINT_CREATED]
    assert percents == [25.0, 50.0, 75.0, 100.0]
    assert len(outcome.execution_metadata.checkpoints_created) == 4
