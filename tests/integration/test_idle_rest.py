"""An idle fleet rests, and the first call after the quiet spell wakes it at once.

The first fleet below looks for unannounced records only once a minute: a call that
completes in seconds after every consumer went to rest was woken by the traffic
announcement. The second hears no announcement of the request (a foreign producer) and
finds it by its end offsets.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.events.envelope import new_event
from toolfleet.events.models import AgentContext, InvocationStatus, InvokeRequested
from toolfleet.events.types import EventType, Source
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration

SERVICES = ("policy", "executor", "validator")


@pytest.fixture
async def fleet(settings: FleetSettings, tmp_path: Path) -> AsyncIterator[Fleet]:
    rested = fleet_settings(settings, tmp_path, idle_after_ms=300, idle_fetch_interval_ms=60_000)
    async with in_process_fleet(rested) as running:
        yield running


@pytest.fixture
async def looking_fleet(settings: FleetSettings, tmp_path: Path) -> AsyncIterator[Fleet]:
    rested = fleet_settings(settings, tmp_path, idle_after_ms=300, idle_fetch_interval_ms=300)
    async with in_process_fleet(rested) as running:
        yield running


def resting(service: str) -> float:
    """Consumers of ``service`` resting now (the ``toolfleet_consumers_resting`` gauge)."""
    value = REGISTRY.get_sample_value("toolfleet_consumers_resting", {"service": service})
    return value or 0.0


async def echo(fleet: Fleet) -> float:
    """Seconds one ``core__echo`` call takes, asserting it succeeded."""
    started = time.monotonic()
    outcome = await fleet.client.call(
        "core__echo",
        {"message": "after a rest"},
        tenant_id="t1",
        agent_did="did:agent:test",
        capability_token=fleet.token("t1"),
        timeout=30,
    )
    assert outcome.status is InvocationStatus.SUCCESS
    return time.monotonic() - started


async def test_the_first_call_after_a_quiet_spell_wakes_every_hop(fleet: Fleet) -> None:
    await echo(fleet)

    for _ in range(2):  # twice: a woken fleet rests again and wakes again
        await eventually(all_resting, timeout=20)
        # Unwoken, the policy consumer would look again only after a minute.
        assert await echo(fleet) < 20


async def all_resting() -> bool:
    return all(resting(service) >= 1 for service in SERVICES)


async def test_a_request_nobody_announced_is_found_by_a_resting_consumer(
    looking_fleet: Fleet,
) -> None:
    fleet = looking_fleet
    await echo(fleet)
    for _ in range(2):
        await eventually(all_resting, timeout=20)
        invocation_id = str(uuid.uuid4())
        request = InvokeRequested(
            invocation_id=uuid.UUID(invocation_id),
            tool_id="core__echo",
            agent_context=AgentContext(agent_did="did:agent:test", tenant_id="t1"),
            parameters={"message": "unannounced"},
            capability_token=fleet.token("t1"),
        )
        envelope = new_event(
            event_type=EventType.INVOKE_REQUESTED,
            source=Source.CLIENT,
            data=request,
            tenant_id="t1",
            invocation_id=invocation_id,
        )
        handle = fleet.client.expect(invocation_id, tenant_id="t1")
        await fleet.publish(envelope)  # a plain producer: no traffic announcement
        outcome = await fleet.client.wait(handle, timeout=30)
        assert outcome.status is InvocationStatus.SUCCESS
        assert outcome.result == {"message": "unannounced", "length": 11}
