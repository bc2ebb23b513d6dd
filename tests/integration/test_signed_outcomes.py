"""Issue 32: an outcome on ``invoke.results`` counts only if the fleet signed it.

The attack that succeeded before: anyone with produce access to the results topic wrote
an ``ai.agent.tool.succeeded`` for a call that waited for approval. Status showed it,
the call could no longer be approved, a duplicate waiting on the call's idempotency key
was answered with it, and ``toolfleet.client`` returned it. Now status, policy and the
client ignore an outcome that is unsigned, signed with another key, or carries a
signature issued for another call; each refusal is audited. Through the HTTP API in
process and policy, executor, validator, status and audit on the real broker, Redis and
Postgres.
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
from toolfleet.auth.outcomes import OutcomeSigner
from toolfleet.bus.producer import Outbound
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.events.outcomes import outcome_event
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration

AGENT = "did:agent:requester"
APPROVER = "did:user:alice"
PARAMS = {"message": "pay the invoice"}
FORGED_RESULT = {"message": "forged", "length": 6}
SERVICES = ("policy", "executor", "validator", "status", "audit")


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("signed-outcomes")
    async with in_process_fleet(fleet_settings(settings, home), SERVICES) as running:
        yield running


@pytest.fixture(scope="module")
def api_settings(fleet: Fleet) -> ApiSettings:
    return ApiSettings(**{**fleet.settings.model_dump(), "api_url": BASE_URL})


async def status_is(
    http: httpx.AsyncClient, fleet: Fleet, owner: str, invocation_id: str, status: str
) -> dict[str, Any]:
    headers = bearer(fleet.token(owner, "did:user:reader"))

    async def reached() -> dict[str, Any] | None:
        response = await http.get(f"/v1/invocations/{invocation_id}", headers=headers)
        view: dict[str, Any] = response.json()
        return view if response.status_code == 200 and view["status"] == status else None

    return await eventually(reached, timeout=30)


def forged_outcome(invocation_id: str, owner: str) -> Envelope:
    """A ``succeeded`` for ``invocation_id`` as a producer on the results topic writes it."""
    parent = new_event(
        event_type=EventType.INVOKE_REQUESTED,
        source=Source.CLIENT,
        data={},
        tenant_id=owner,
        invocation_id=invocation_id,
    )
    outcome = ToolOutcome(
        invocation_id=uuid.UUID(invocation_id),
        status=InvocationStatus.SUCCESS,
        agent_did=AGENT,
        tenant_id=owner,
        tool_id="core__echo",
        tool_version="1.0.0",
        result=FORGED_RESULT,
    )
    return outcome_event(parent, Source.VALIDATOR, outcome)


def with_signature(event: Envelope, signature: str) -> Envelope:
    return event.model_copy(update={"data": {**event.data, "signature": signature}})


async def refusals(fleet: Fleet, invocation_id: str, count: int) -> list[Envelope]:
    async def found() -> list[Envelope] | None:
        events = [
            e
            for e in await fleet.read(TopicName.EVENTS, invocation_id=invocation_id)
            if e.type == EventType.OUTCOME_REFUSED
        ]
        return events if len(events) >= count else None

    return await eventually(found, timeout=30)


async def test_forged_outcomes_neither_end_a_pending_call_nor_reach_anyone(
    http: httpx.AsyncClient, fleet: Fleet
) -> None:
    owner = f"signed_{uuid.uuid4().hex[:10]}"
    # A real, signed outcome of another call: its signature is what an attacker can copy.
    other = await fleet.client.call(
        "core__echo",
        {"message": "other"},
        tenant_id=owner,
        agent_did=AGENT,
        capability_token=fleet.token(owner, AGENT),
        timeout=30,
    )
    assert other.status is InvocationStatus.SUCCESS
    assert other.signature is not None  # the client returns only signed outcomes

    # The call that waits for approval, with an idempotency key and a duplicate waiting.
    key = f"idem-{uuid.uuid4().hex[:8]}"
    body = {
        "tool_id": "core__echo",
        "agent_context": {"agent_did": AGENT, "tenant_id": owner},
        "parameters": PARAMS,
        "execution_options": {"require_approval": True, "idempotency_key": key},
    }
    accepted = await http.post(
        "/v1/invocations", json=body, headers=bearer(fleet.token(owner, AGENT))
    )
    assert accepted.status_code == 202, accepted.text
    invocation_id: str = accepted.json()["invocation_id"]
    await status_is(http, fleet, owner, invocation_id, "pending_approval")
    waiting = fleet.client.expect(invocation_id, tenant_id=owner)
    duplicate = str(uuid.uuid4())
    duplicate_request = new_event(
        event_type=EventType.INVOKE_REQUESTED,
        source=Source.CLIENT,
        data={**body, "invocation_id": duplicate, "capability_token": fleet.token(owner, AGENT)},
        tenant_id=owner,
        invocation_id=duplicate,
    )
    await fleet.publish(duplicate_request)
    # Parked as a waiter of the first call's key: nothing answers it yet.
    await status_is(http, fleet, owner, duplicate, "pending")

    # The attack: three forged ``succeeded`` outcomes of the pending call.
    unsigned = forged_outcome(invocation_id, owner)
    other_key = OutcomeSigner(b"not-the-fleet-key-" + b"x" * 20).seal(
        forged_outcome(invocation_id, owner)
    )
    (real,) = [
        e
        for e in await fleet.read(TopicName.RESULTS, invocation_id=str(other.invocation_id))
        if e.source == Source.VALIDATOR
    ]
    moved = with_signature(forged_outcome(invocation_id, owner), real.data["signature"])
    for forged in (unsigned, other_key, moved):
        await fleet.producer.send(Outbound(envelope=forged, topic=fleet.topic(TopicName.RESULTS)))

    # Status and policy (the duplicate waits on this call's key) refuse each one.
    refused = await refusals(fleet, invocation_id, count=6)
    by_reader = {(e.source, e.data["refusal"], e.data["refused_event_id"]) for e in refused}
    for reader in (Source.STATUS, Source.POLICY):
        assert {(kind, event_id) for source, kind, event_id in by_reader if source == reader} == {
            ("unsigned", unsigned.id),
            ("forged", other_key.id),
            ("misbound", moved.id),
        }
    view = await status_is(http, fleet, owner, invocation_id, "pending_approval")
    assert view["result"] is None

    # The call can still be approved, and runs.
    approver = bearer(fleet.token(owner, APPROVER, scopes=["approver"]))
    approved = await http.post(f"/v1/invocations/{invocation_id}/approve", headers=approver)
    assert approved.status_code == 200, approved.text
    done = await status_is(http, fleet, owner, invocation_id, "success")
    expected = {"message": PARAMS["message"], "length": len(PARAMS["message"])}
    assert done["result"] == expected

    # The client returned the real outcome, not the first forged one it read.
    outcome = await fleet.client.wait(waiting, timeout=30)
    assert (outcome.status, outcome.result) == (InvocationStatus.SUCCESS, expected)
    # The duplicate got the real result too, once.
    answered = await status_is(http, fleet, owner, duplicate, "success")
    assert answered["result"] == expected
    assert len(await fleet.read(TopicName.RESULTS, invocation_id=duplicate)) == 1

    # Each refusal is in the audit trail, a failure naming the refused event.
    async def audited() -> list[Envelope] | None:
        records = [
            e
            for e in await fleet.read(TopicName.AUDIT, invocation_id=invocation_id)
            if e.type == EventType.OUTCOME_REFUSED
        ]
        return records if len(records) >= 6 else None

    records = await eventually(audited, timeout=30)
    assert {(r.data["outcome"], r.data["error_code"]) for r in records} == {
        ("failure", "permission_denied")
    }
    assert {r.data["tenant_id"] for r in records} == {owner}
