"""Issue 32, identity: a call is ``(tenant_id, invocation_id)``, end to end.

The HTTP API in-process, and policy, executor, validator and status consuming the real
broker, Redis and Postgres. Tenant A naming tenant B's invocation id in a signed cancel
flags A's call of that id, not B's; and the same non-UUID id sent by two tenants names
two calls.
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
from toolfleet.events.envelope import new_event
from toolfleet.events.identity import CallKey, invocation_uuid
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.events.types import TERMINAL_TYPES, EventType, Source, TopicName
from toolfleet.settings import FleetSettings
from toolfleet.storage.cancel_flags import RedisCancelFlags
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration

AGENT = "did:agent:requester"
APPROVER = "did:user:alice"
SERVICES = ("policy", "executor", "validator", "status")


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("call_identity")
    async with in_process_fleet(fleet_settings(settings, home), SERVICES) as running:
        yield running


@pytest.fixture(scope="module")
def api_settings(fleet: Fleet) -> ApiSettings:
    return ApiSettings(**{**fleet.settings.model_dump(), "api_url": BASE_URL})


def tenant(name: str) -> str:
    return f"{name}_{uuid.uuid4().hex[:10]}"


async def status_is(
    http: httpx.AsyncClient, fleet: Fleet, owner: str, invocation_id: str, status: str
) -> dict[str, Any]:
    headers = bearer(fleet.token(owner, "did:user:reader"))

    async def reached() -> dict[str, Any] | None:
        response = await http.get(f"/v1/invocations/{invocation_id}", headers=headers)
        view: dict[str, Any] = response.json()
        return view if response.status_code == 200 and view["status"] == status else None

    return await eventually(reached, timeout=30)


async def parked(http: httpx.AsyncClient, fleet: Fleet, owner: str) -> str:
    """A call of ``owner`` that waits for approval; its invocation id."""
    body = {
        "tool_id": "core__echo",
        "agent_context": {"agent_did": AGENT, "tenant_id": owner},
        "parameters": {"message": f"from {owner}"},
        "execution_options": {"require_approval": True},
    }
    accepted = await http.post(
        "/v1/invocations", json=body, headers=bearer(fleet.token(owner, AGENT))
    )
    assert accepted.status_code == 202, accepted.text
    invocation_id: str = accepted.json()["invocation_id"]
    await status_is(http, fleet, owner, invocation_id, "pending_approval")
    return invocation_id


async def test_a_signed_cancel_of_tenant_a_under_bs_id_does_not_cancel_bs_call(
    http: httpx.AsyncClient, fleet: Fleet
) -> None:
    """The cancel flag was keyed by the invocation id alone: A's cancel naming B's
    pending id raised B's flag, and B's call was refused as cancelled once approved."""
    a, b = tenant("ident_a"), tenant("ident_b")
    victim = await parked(http, fleet, b)
    await fleet.client.cancel(victim, tenant_id=a, requested_by="did:agent:a")
    # A's own parked call, cancelled after: policy reads A's control events in order, so
    # once it is cancelled, A's cancel naming B's id has been handled too.
    own = await parked(http, fleet, a)
    await fleet.client.cancel(own, tenant_id=a, requested_by="did:agent:a")
    await status_is(http, fleet, a, own, "cancelled")
    redis = connect_redis(fleet.settings.redis_url)
    try:
        flags = RedisCancelFlags(redis)
        assert await flags.is_requested(CallKey(tenant_id=a, invocation_id=victim))
        assert not await flags.is_requested(CallKey(tenant_id=b, invocation_id=victim))
    finally:
        await redis.aclose()

    approver = bearer(fleet.token(b, APPROVER, scopes=["approver"]))
    approved = await http.post(f"/v1/invocations/{victim}/approve", headers=approver)
    assert approved.status_code == 200, approved.text
    done = await status_is(http, fleet, b, victim, "success")
    assert done["result"]["message"] == f"from {b}"


async def outcome_of(fleet: Fleet, invocation_id: str) -> ToolOutcome:
    """The terminal outcome published for ``invocation_id``, once there is one."""

    async def published() -> ToolOutcome | None:
        for event in await fleet.read(TopicName.RESULTS, invocation_id=invocation_id):
            if event.type in TERMINAL_TYPES:
                return event.data_as(ToolOutcome)
        return None

    return await eventually(published, timeout=30)


async def test_one_non_uuid_id_from_two_tenants_names_two_calls(fleet: Fleet) -> None:
    """A non-UUID id derived the same invocation id whoever sent it: tenant A could
    take the id tenant B's ``job-…`` would get before B sent it."""
    job = f"job-{uuid.uuid4().hex[:8]}"
    outcomes: dict[str, tuple[str, ToolOutcome]] = {}
    for owner in (tenant("ident_a"), tenant("ident_b")):
        data = {
            "tool_id": "core__echo",
            "agent_context": {"agent_did": AGENT, "tenant_id": owner},
            "parameters": {"message": owner},
            "capability_token": fleet.token(owner, AGENT),
        }
        # An honest producer that names its call by its event id only.
        request = new_event(
            event_type=EventType.INVOKE_REQUESTED,
            source=Source.CLIENT,
            data=data,
            tenant_id=owner,
            invocation_id=None,
            event_id=job,
        )
        expected = invocation_uuid(job, tenant_id=owner)
        await fleet.publish(request)
        outcomes[owner] = (expected, await outcome_of(fleet, expected))
    first_id, second_id = (expected for expected, _ in outcomes.values())
    assert first_id != second_id
    for owner, (expected, outcome) in outcomes.items():
        assert str(outcome.invocation_id) == expected
        assert outcome.status is InvocationStatus.SUCCESS, outcome.error
        assert outcome.tenant_id == owner
        assert outcome.result is not None
        assert outcome.result["message"] == owner
