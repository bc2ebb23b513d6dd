"""Issue 8, finding 1: only approvers decide, and policy trusts only signed decisions.

The whole path a user and an attacker take: the HTTP API in-process, and policy,
executor, validator, audit and status consuming the real broker, Redis and Postgres.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api import BASE_URL, bearer
from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.api import ApiSettings
from toolfleet.auth.control import ControlAction, ControlClaims, ControlSigner
from toolfleet.auth.grants import parameters_hash
from toolfleet.bus.producer import Outbound
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.identity import trace_id_of
from toolfleet.events.models import ApprovalDecision, CancelRequested
from toolfleet.events.types import EventType, TopicName
from toolfleet.settings import FleetSettings
from toolfleet.storage.redis import connect_redis
from toolfleet.storage.revocation import RedisRevocationList

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"
AGENT = "did:agent:requester"
APPROVER = "did:user:alice"
PARAMS = {"message": "mail alice@example.com"}
SERVICES = ("policy", "executor", "validator", "audit", "status")


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("approvals")
    async with in_process_fleet(fleet_settings(settings, home), SERVICES) as running:
        yield running


@pytest.fixture(scope="module")
def api_settings(fleet: Fleet) -> ApiSettings:
    return ApiSettings(**{**fleet.settings.model_dump(), "api_url": BASE_URL})


def tenant() -> str:
    return f"appr_{uuid.uuid4().hex[:10]}"


async def parked(http: httpx.AsyncClient, fleet: Fleet, owner: str, agent_token: str) -> str:
    """Submit a call that needs approval as the agent; return its id once it waits."""
    body = {
        "tool_id": "core__echo",
        "agent_context": {"agent_did": AGENT, "tenant_id": owner},
        "parameters": PARAMS,
        "execution_options": {"require_approval": True},
    }
    accepted = await http.post("/v1/invocations", json=body, headers=bearer(agent_token))
    assert accepted.status_code == 202, accepted.text
    invocation_id: str = accepted.json()["invocation_id"]
    await status_is(http, fleet, owner, invocation_id, "pending_approval")
    return invocation_id


async def status_is(
    http: httpx.AsyncClient, fleet: Fleet, owner: str, invocation_id: str, status: str
) -> dict[str, Any]:
    headers = bearer(fleet.token(owner, "did:user:reader"))

    async def reached() -> dict[str, Any] | None:
        response = await http.get(f"/v1/invocations/{invocation_id}", headers=headers)
        view: dict[str, Any] = response.json()
        return view if response.status_code == 200 and view["status"] == status else None

    return await eventually(reached, timeout=30)


async def refusals(fleet: Fleet, invocation_id: str, count: int) -> list[Envelope]:
    """The audit records of refused control events for one invocation, once ``count`` exist."""

    async def audited() -> list[Envelope] | None:
        found = [
            e
            for e in await fleet.read(TopicName.AUDIT, invocation_id=invocation_id)
            if e.type == EventType.CONTROL_REFUSED
        ]
        return found if len(found) >= count else None

    return await eventually(audited, timeout=30)


async def produce_control(
    fleet: Fleet, event_type: EventType, data: ApprovalDecision | CancelRequested
) -> None:
    envelope = new_event(
        event_type=event_type,
        source="/somebody/with/produce/rights",
        data=data,
        tenant_id=data.tenant_id,
        invocation_id=str(data.invocation_id),
    )
    await fleet.producer.send(Outbound(envelope=envelope, topic=fleet.topic(TopicName.CONTROL)))


async def test_only_an_approver_who_is_not_the_requester_decides(
    http: httpx.AsyncClient, fleet: Fleet
) -> None:
    owner = tenant()
    agent_token = fleet.token(owner, AGENT)
    invocation_id = await parked(http, fleet, owner, agent_token)
    url = f"/v1/invocations/{invocation_id}"

    own = await http.post(f"{url}/approve", headers=bearer(agent_token))
    assert own.status_code == 403
    assert own.headers["content-type"] == PROBLEM
    assert own.json()["code"] == "permission_denied"
    assert "approver scope" in own.json()["detail"]
    self_approver = fleet.token(owner, AGENT, scopes=["approver"])
    selfish = await http.post(f"{url}/approve", headers=bearer(self_approver))
    assert selfish.status_code == 403
    assert "its own call" in selfish.json()["detail"]
    elsewhere = fleet.token(tenant(), APPROVER, scopes=["approver"])
    assert (await http.post(f"{url}/approve", headers=bearer(elsewhere))).status_code == 404
    assert (await http.post(f"{url}/deny", headers=bearer(agent_token))).status_code == 403

    approver = bearer(fleet.token(owner, APPROVER, scopes=["approver"]))
    shown = (await http.get(url, headers=approver)).json()
    assert shown["status"] == "pending_approval"
    assert shown["agent_did"] == AGENT
    assert shown["approval"] == {
        "tool_id": "core__echo",
        "tool_version": "1.0.0",
        "parameters": {"message": "mail [REDACTED:email]"},
        "parameters_hash": parameters_hash("core__echo", "1.0.0", PARAMS),
    }
    approved = await http.post(f"{url}/approve", headers=approver)
    assert approved.status_code == 200, approved.text
    done = await status_is(http, fleet, owner, invocation_id, "success")
    assert done["result"]["length"] == len(PARAMS["message"])
    assert done["approval"] is None


async def test_unsigned_and_forged_decisions_leave_the_call_pending_and_are_audited(
    http: httpx.AsyncClient, fleet: Fleet
) -> None:
    owner = tenant()
    invocation_id = await parked(http, fleet, owner, fleet.token(owner, AGENT))
    digest = parameters_hash("core__echo", "1.0.0", PARAMS)
    decision = ApprovalDecision(
        invocation_id=uuid.UUID(invocation_id),
        tenant_id=owner,
        approver=APPROVER,
        parameters_hash=digest,
    )
    await produce_control(fleet, EventType.APPROVAL_GRANTED, decision)
    forger = ControlSigner(b"not-the-fleet-key-but-long-enough!!")
    claims = ControlClaims(
        invocation_id=invocation_id,
        tenant_id=owner,
        action=ControlAction.APPROVE,
        decider=APPROVER,
        parameters_hash=digest,
    )
    forged = decision.model_copy(update={"signature": forger.sign(claims)})
    await produce_control(fleet, EventType.APPROVAL_GRANTED, forged)

    records = await refusals(fleet, invocation_id, 2)
    assert {r.data["outcome"] for r in records} == {"failure"}
    assert {r.data["error_code"] for r in records} == {"permission_denied"}
    assert {r.data["actor"] for r in records} == {APPROVER}
    assert records[0].data["ocsf"]["status_id"] == 2  # Failure, for the SIEM
    reasons = {r.data["ocsf"]["unmapped"]["reason"] for r in records}
    assert reasons == {
        "control event is not signed",
        "control signature is signed by an unknown key",
    }
    # Policy handled both (it audited them) and the call still waits for a real approver.
    view = await status_is(http, fleet, owner, invocation_id, "pending_approval")
    assert view["approval"]["parameters_hash"] == digest
    approver = bearer(fleet.token(owner, APPROVER, scopes=["approver"]))
    assert (
        await http.post(f"/v1/invocations/{invocation_id}/approve", headers=approver)
    ).status_code == 200
    await status_is(http, fleet, owner, invocation_id, "success")


async def test_only_a_signed_cancel_of_the_calls_own_tenant_cancels(
    http: httpx.AsyncClient, fleet: Fleet
) -> None:
    owner = tenant()
    invocation_id = await parked(http, fleet, owner, fleet.token(owner, AGENT))
    url = f"/v1/invocations/{invocation_id}/cancel"
    stranger = bearer(fleet.token(tenant(), "did:agent:stranger"))
    assert (await http.post(url, headers=stranger)).status_code == 404
    unsigned = CancelRequested(
        invocation_id=uuid.UUID(invocation_id), tenant_id=owner, requested_by="did:x"
    )
    await produce_control(fleet, EventType.CANCEL_REQUESTED, unsigned)
    (record,) = await refusals(fleet, invocation_id, 1)
    assert record.data["ocsf"]["unmapped"]["control_type"] == EventType.CANCEL_REQUESTED
    await status_is(http, fleet, owner, invocation_id, "pending_approval")

    cancelled = await http.post(url, headers=bearer(fleet.token(owner, AGENT)))
    assert cancelled.json()["cancelled"] is True
    await status_is(http, fleet, owner, invocation_id, "cancelled")


async def test_an_approval_after_the_requester_was_revoked_is_permission_denied(
    http: httpx.AsyncClient, fleet: Fleet
) -> None:
    owner = tenant()
    issued = fleet.issuer.mint(tenant_id=owner, agent_did=AGENT, tool_id="*")
    invocation_id = await parked(http, fleet, owner, issued.token)
    redis = connect_redis(fleet.settings.redis_url)
    try:
        await RedisRevocationList(redis).revoke(issued.jti, ttl_s=600)
    finally:
        await redis.aclose()
    approver = bearer(fleet.token(owner, APPROVER, scopes=["approver"]))
    approved = await http.post(f"/v1/invocations/{invocation_id}/approve", headers=approver)
    assert approved.status_code == 200
    view = await status_is(http, fleet, owner, invocation_id, "permission_denied")
    assert view["error"]["code"] == "permission_denied"
    assert "revoked" in view["error"]["message"]
    executed = await fleet.read(TopicName.AUTHORIZED, invocation_id=invocation_id)
    assert executed == []


async def test_an_unsigned_cancel_does_not_stop_a_running_call(
    http: httpx.AsyncClient, fleet: Fleet
) -> None:
    owner = tenant()
    body = {
        "tool_id": "core__long_running",
        "agent_context": {"agent_did": AGENT, "tenant_id": owner},
        "parameters": {"steps": 20, "step_seconds": 0.1},
    }
    headers = bearer(fleet.token(owner, AGENT))
    accepted = await http.post("/v1/invocations", json=body, headers=headers)
    invocation_id = accepted.json()["invocation_id"]
    await status_is(http, fleet, owner, invocation_id, "running")
    unsigned = CancelRequested(
        invocation_id=uuid.UUID(invocation_id), tenant_id=owner, requested_by="did:x"
    )
    await produce_control(fleet, EventType.CANCEL_REQUESTED, unsigned)
    await refusals(fleet, invocation_id, 1)
    done = await status_is(http, fleet, owner, invocation_id, "success")
    assert done["result"]["steps_completed"] == 20


async def test_decisions_and_cancels_from_the_api_join_the_calls_trace(
    http: httpx.AsyncClient, fleet: Fleet
) -> None:
    owner = tenant()
    agent = bearer(fleet.token(owner, AGENT))
    approver = bearer(fleet.token(owner, APPROVER, scopes=["approver"]))
    body = {
        "tool_id": "core__echo",
        "agent_context": {"agent_did": AGENT, "tenant_id": owner},
        "parameters": PARAMS,
        "execution_options": {"require_approval": True},
    }
    traces: dict[str, str] = {}
    for verb in ("approve", "deny", "cancel"):
        trace_id = uuid.uuid4().hex
        headers = {**agent, "traceparent": f"00-{trace_id}-{'1' * 16}-01"}
        accepted = await http.post("/v1/invocations", json=body, headers=headers)
        assert accepted.status_code == 202, accepted.text
        invocation_id = accepted.json()["invocation_id"]
        shown = await status_is(http, fleet, owner, invocation_id, "pending_approval")
        assert shown["trace_id"] == trace_id
        decided = await http.post(
            f"/v1/invocations/{invocation_id}/{verb}",
            headers=agent if verb == "cancel" else approver,
        )
        assert decided.status_code == 200, decided.text
        traces[invocation_id] = trace_id

    for invocation_id, trace_id in traces.items():
        sent = await eventually(
            lambda i=invocation_id: fleet.read(TopicName.CONTROL, invocation_id=i), timeout=30
        )
        assert {trace_id_of(e.traceparent) for e in sent} == {trace_id}
