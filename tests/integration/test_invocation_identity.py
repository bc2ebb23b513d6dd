"""Issue 32, attacks 1-4: an invocation id names one call, and the first request fixes it.

Each test is an attack that succeeded before: a later request under a known id rewrote
or took over the first call. Now policy refuses it to its sender only
(``invocation_id_conflict``), status keeps what the first request wrote, a request keyed
by another tenant goes to the DLQ, and policy judges "approver is not requester"
against the request it parked. Through the HTTP API in process and policy, executor,
validator and status on the real broker, Redis and Postgres.
"""

from __future__ import annotations

import base64
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
from toolfleet.auth.grants import parameters_hash
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration

AGENT = "did:agent:requester"
MALLORY = "did:agent:mallory"
APPROVER = "did:user:alice"
PARAMS = {"message": "send the weekly report"}
SERVICES = ("policy", "executor", "validator", "status")
CONFLICT = "invocation_id_conflict"


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("identity")
    async with in_process_fleet(fleet_settings(settings, home), SERVICES) as running:
        yield running


@pytest.fixture(scope="module")
def api_settings(fleet: Fleet) -> ApiSettings:
    return ApiSettings(**{**fleet.settings.model_dump(), "api_url": BASE_URL})


def tenant() -> str:
    return f"ident_{uuid.uuid4().hex[:10]}"


async def parked(http: httpx.AsyncClient, fleet: Fleet, owner: str) -> str:
    """The agent's call that waits for approval, through the API; its id once parked."""
    body = {
        "tool_id": "core__echo",
        "agent_context": {"agent_did": AGENT, "tenant_id": owner},
        "parameters": PARAMS,
        "execution_options": {"require_approval": True},
    }
    headers = bearer(fleet.token(owner, AGENT))
    accepted = await http.post("/v1/invocations", json=body, headers=headers)
    assert accepted.status_code == 202, accepted.text
    invocation_id: str = accepted.json()["invocation_id"]
    # Status folds a call's events from several topics as they come: the approval can
    # be folded before the request it parks, so wait for the row to show both.
    await status_is(http, fleet, owner, invocation_id, "pending_approval", parameters=PARAMS)
    return invocation_id


async def status_is(
    http: httpx.AsyncClient,
    fleet: Fleet,
    owner: str,
    invocation_id: str,
    status: str,
    *,
    parameters: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The owner's view of the call once it has `status` (and, if given, shows the
    approval's `parameters`)."""
    headers = bearer(fleet.token(owner, "did:user:reader"))

    async def reached() -> dict[str, Any] | None:
        response = await http.get(f"/v1/invocations/{invocation_id}", headers=headers)
        view: dict[str, Any] = response.json()
        if response.status_code != 200 or view["status"] != status:
            return None
        if parameters is not None and (view["approval"] or {}).get("parameters") != parameters:
            return None
        return view

    return await eventually(reached, timeout=30)


def request(
    fleet: Fleet,
    invocation_id: str,
    owner: str,
    *,
    agent: str = MALLORY,
    parameters: dict[str, Any] | None = None,
    tool_id: str = "core__echo",
    token: str | None = None,
    **options: Any,
) -> Envelope:
    """A request as a producer with write access to the requests topic sends it."""
    data = {
        "invocation_id": invocation_id,
        "tool_id": tool_id,
        "agent_context": {"agent_did": agent, "tenant_id": owner},
        "parameters": parameters if parameters is not None else {"message": "rm -rf /"},
        "capability_token": token if token is not None else fleet.token(owner, agent),
        "execution_options": options,
    }
    return new_event(
        event_type=EventType.INVOKE_REQUESTED,
        source=Source.CLIENT,
        data=data,
        tenant_id=owner,
        invocation_id=invocation_id,
    )


async def outcomes(
    fleet: Fleet, invocation_id: str, *, count: int = 1, code: str | None = None
) -> list[Envelope]:
    """The outcomes of ``invocation_id`` (with error ``code``, if given), once ``count`` exist."""

    async def found() -> list[Envelope] | None:
        events = [
            e
            for e in await fleet.read(TopicName.RESULTS, invocation_id=invocation_id)
            if code is None or (e.data.get("error") or {}).get("code") == code
        ]
        return events if len(events) >= count else None

    return await eventually(found, timeout=30)


async def approve(http: httpx.AsyncClient, fleet: Fleet, owner: str, invocation_id: str) -> None:
    approver = bearer(fleet.token(owner, APPROVER, scopes=["approver"]))
    approved = await http.post(f"/v1/invocations/{invocation_id}/approve", headers=approver)
    assert approved.status_code == 200, approved.text


def approval_view(view: dict[str, Any]) -> dict[str, Any]:
    return {"agent_did": view["agent_did"], "approval": view["approval"]}


async def test_the_agent_cannot_swap_the_call_that_waits_for_approval(
    http: httpx.AsyncClient, fleet: Fleet
) -> None:
    """Attack 1: the same agent re-sends its pending id with other parameters."""
    owner = tenant()
    invocation_id = await parked(http, fleet, owner)
    before = await status_is(http, fleet, owner, invocation_id, "pending_approval")
    assert before["approval"]["parameters"] == PARAMS

    await fleet.publish(request(fleet, invocation_id, owner, agent=AGENT))
    (refusal,) = await outcomes(fleet, invocation_id, code=CONFLICT)
    assert refusal.tenantid == owner
    assert refusal.type == EventType.FAILED
    assert refusal.data["error"]["retryable"] is False

    after = await status_is(http, fleet, owner, invocation_id, "pending_approval")
    assert approval_view(after) == approval_view(before)
    assert after["approval"]["parameters_hash"] == parameters_hash("core__echo", "1.0.0", PARAMS)
    await approve(http, fleet, owner, invocation_id)
    done = await status_is(http, fleet, owner, invocation_id, "success")
    assert done["result"] == {"message": PARAMS["message"], "length": len(PARAMS["message"])}


async def test_another_tenant_cannot_take_over_a_pending_call(
    http: httpx.AsyncClient, fleet: Fleet
) -> None:
    """Attack 2: tenant A sends a valid request of its own under tenant B's pending id."""
    victim, attacker = tenant(), tenant()
    invocation_id = await parked(http, fleet, victim)
    await fleet.publish(request(fleet, invocation_id, attacker, require_approval=True))

    (refusal,) = await outcomes(fleet, invocation_id, code=CONFLICT)
    assert refusal.tenantid == refusal.partitionkey == attacker  # the sender's own key
    assert refusal.data["tenant_id"] == attacker
    # The attacker's request is a call of its own, (attacker, id): its row shows the
    # refusal (it was 404 when a row was the id alone, and the refusal went nowhere).
    refused = await status_is(http, fleet, attacker, invocation_id, "error")
    assert refused["error"]["code"] == CONFLICT
    assert (refused["tenant_id"], refused["agent_did"]) == (attacker, MALLORY)
    assert refused["result"] is None
    view = await status_is(http, fleet, victim, invocation_id, "pending_approval")
    assert (view["tenant_id"], view["agent_did"]) == (victim, AGENT)
    assert view["approval"]["parameters"] == PARAMS
    await approve(http, fleet, victim, invocation_id)
    done = await status_is(http, fleet, victim, invocation_id, "success")
    assert done["result"]["message"] == PARAMS["message"]
    # Neither sees the other's call: the attacker's row still shows its own refusal.
    again = await status_is(http, fleet, attacker, invocation_id, "error")
    assert again == refused


async def test_another_tenant_cannot_receive_a_calls_result_through_an_idempotency_key(
    http: httpx.AsyncClient, fleet: Fleet
) -> None:
    """Attack 3: A claims an idempotency key under B's id, then sends a duplicate."""
    victim, attacker = tenant(), tenant()
    invocation_id = await parked(http, fleet, victim)
    key = f"idem-{uuid.uuid4().hex[:8]}"
    mine = {"message": "attacker"}
    await fleet.publish(
        request(fleet, invocation_id, attacker, parameters=mine, idempotency_key=key)
    )
    await outcomes(fleet, invocation_id, code=CONFLICT)
    duplicate = str(uuid.uuid4())
    await fleet.publish(request(fleet, duplicate, attacker, parameters=mine, idempotency_key=key))
    await approve(http, fleet, victim, invocation_id)
    await status_is(http, fleet, victim, invocation_id, "success")

    (answer,) = await outcomes(fleet, duplicate)
    assert answer.tenantid == attacker
    assert answer.data["tenant_id"] == attacker
    assert answer.data["result"] == {"message": "attacker", "length": len("attacker")}
    # The victim's call ended once, with its own result, to the victim.
    ended = [
        e
        for e in await fleet.read(TopicName.RESULTS, invocation_id=invocation_id)
        if e.data.get("status") == "success"
    ]
    assert [(e.tenantid, e.data["result"]["message"]) for e in ended] == [
        (victim, PARAMS["message"])
    ]


async def test_a_request_keyed_by_another_tenant_is_dead_lettered_and_projects_nothing(
    http: httpx.AsyncClient, fleet: Fleet
) -> None:
    """Attack 4: a record keyed by tenant B names another tenant, or carries a garbage
    token under an attribute of its own; the real agent then tries to approve its call."""
    victim, attacker = tenant(), tenant()
    invocation_id = await parked(http, fleet, victim)
    before = await status_is(http, fleet, victim, invocation_id, "pending_approval")
    another = request(fleet, invocation_id, attacker).model_copy(update={"partitionkey": victim})
    garbage = request(
        fleet, invocation_id, victim, token="eyJhbGciOiJub25lIn0.e30.", parameters={}
    ).model_copy(update={"partitionkey": victim, "tenantid": attacker})
    for forged in (another, garbage):
        await fleet.publish(forged)

    async def dead_lettered() -> list[Envelope] | None:
        mentioning = [
            e
            for e in await fleet.read(TopicName.DLQ)
            if invocation_id.encode() in base64.b64decode(e.data["value_b64"])
            or any(
                invocation_id.encode() in base64.b64decode(h["value_b64"])
                for h in e.data["headers"]
            )
        ]
        # Both forged records, each by policy and by status.
        return mentioning if len(mentioning) >= 4 else None

    records = await eventually(dead_lettered, timeout=30)
    assert {r.data["error"]["details"]["reason"] for r in records} == {"key_tenant_mismatch"}
    assert {r.data["consumer_group"].rsplit(".", 1)[-1] for r in records} >= {"policy", "status"}
    assert await fleet.read(TopicName.RESULTS, invocation_id=invocation_id) == []

    view = await status_is(http, fleet, victim, invocation_id, "pending_approval")
    assert approval_view(view) == approval_view(before)
    assert view["agent_did"] == AGENT
    url = f"/v1/invocations/{invocation_id}/approve"
    self_approver = bearer(fleet.token(victim, AGENT, scopes=["approver"]))
    refused = await http.post(url, headers=self_approver)
    assert refused.status_code == 403
    assert "its own call" in refused.json()["detail"]


async def test_policy_refuses_a_signed_approval_by_the_requesting_agent(
    http: httpx.AsyncClient, fleet: Fleet
) -> None:
    """Approver is not requester, judged by policy on the request it parked: a signed
    approval (as a trusted CLI writes one) naming the requesting agent changes nothing."""
    owner = tenant()
    invocation_id = await parked(http, fleet, owner)
    await fleet.client.approve(invocation_id, tenant_id=owner, approver=AGENT)

    async def refused() -> list[Envelope] | None:
        found = [
            e
            for e in await fleet.read(TopicName.EVENTS, invocation_id=invocation_id)
            if e.type == EventType.CONTROL_REFUSED
        ]
        return found or None

    (refusal,) = await eventually(refused, timeout=30)
    assert refusal.data["actor"] == AGENT
    assert "its own call" in refusal.data["reason"]
    await status_is(http, fleet, owner, invocation_id, "pending_approval")
    await approve(http, fleet, owner, invocation_id)
    await status_is(http, fleet, owner, invocation_id, "success")
