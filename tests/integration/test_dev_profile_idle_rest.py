"""The dev profile: consumers rest once caught up, and the rings of acknowledged sends wake
each hop.

The first fleet below looks for records nobody rang only once a minute: a call that
completes in seconds while every consumer (and the client's watcher) rests between hops
was woken by rings. The second hears no ring of the request (a foreign producer) and
finds it by its end offsets.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from prometheus_client import REGISTRY
from redis.asyncio import Redis

from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.devstack.broker_profile import DevBrokerSettings
from toolfleet.devstack.broker_profile.doorbell import (
    FetchPace,
    TrafficSignal,
    fast_channel,
    traffic_channel,
)
from toolfleet.events.envelope import new_event
from toolfleet.events.models import AgentContext, InvocationStatus, InvokeRequested
from toolfleet.events.types import EventType, Source
from toolfleet.settings import FleetSettings
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration

SERVICES = ("policy", "executor", "validator")


@pytest.fixture(params=[0, 300], ids=["rest-when-caught-up", "rest-after-300ms"])
async def fleet(
    settings: FleetSettings, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Fleet]:
    rested = doorbell(
        fleet_settings(settings, tmp_path),
        idle_after_ms=request.param,
        idle_fetch_interval_ms=60_000,
    )
    async with in_process_fleet(rested) as running:
        yield running


@pytest.fixture
async def looking_fleet(settings: FleetSettings, tmp_path: Path) -> AsyncIterator[Fleet]:
    rested = doorbell(
        fleet_settings(settings, tmp_path), idle_after_ms=300, idle_fetch_interval_ms=300
    )
    async with in_process_fleet(rested) as running:
        yield running


def doorbell(
    fleet: FleetSettings, *, idle_after_ms: int, idle_fetch_interval_ms: int
) -> DevBrokerSettings:
    """``fleet`` with the dev profile's doorbell knobs (its workers read them from it)."""
    return DevBrokerSettings(
        **fleet.model_dump(exclude_unset=True),
        idle_after_ms=idle_after_ms,
        idle_fetch_interval_ms=idle_fetch_interval_ms,
    )


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


async def test_every_hop_rests_between_calls_and_is_woken_by_rings(fleet: Fleet) -> None:
    await echo(fleet)

    for _ in range(3):  # a woken fleet rests again and wakes again
        await eventually(all_resting, timeout=20)
        # Unwoken, each hop would look again only after a minute.
        assert await echo(fleet) < 20


async def test_a_burst_of_calls_needs_no_look_at_the_interval(fleet: Fleet) -> None:
    """Concurrent calls: consumers rest and wake many times while records keep coming;
    a ring lost in that churn would hold a call for the one-minute interval."""
    durations = await asyncio.gather(*(echo(fleet) for _ in range(20)))
    assert max(durations) < 20


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


@pytest.fixture
async def channel_on(redis_url: str) -> AsyncIterator[tuple[str, Redis]]:
    """A fleet's traffic channel of its own, and the Redis it rings on."""
    redis = connect_redis(redis_url)
    try:
        yield traffic_channel(f"t{uuid.uuid4().hex[:6]}."), redis
    finally:
        await redis.aclose()


async def test_a_listener_is_live_once_subscribed_and_wakes_the_consumers_of_a_rung_topic(
    channel_on: tuple[str, Redis],
) -> None:
    channel, redis = channel_on
    listener = TrafficSignal(redis, channel=channel)
    ringer = TrafficSignal(redis, channel=channel)  # another process
    of_topic = FetchPace(topics=["x.results"], idle_after_s=0, interval_s=30)
    of_other = FetchPace(topics=["x.other"], idle_after_s=0, interval_s=30)
    listener.register(of_topic)
    listener.register(of_other)

    async def rings_of_topic() -> int:
        return of_topic.rings if listener.live else 0

    stop = asyncio.Event()
    listening = asyncio.create_task(listener.listen(stop))
    try:
        # Confirmed: rings sent before may have been missed, so every consumer looks once.
        assert await eventually(rings_of_topic, timeout=10) == 1
        assert of_other.rings == 1
        ringer.announce("x.results")  # an acknowledged send elsewhere

        async def rung_again() -> bool:
            return of_topic.rings == 2

        await eventually(rung_again, timeout=10)
        assert of_other.rings == 1
    finally:
        stop.set()
        await listening
        await ringer.close()
    assert not listener.live  # stopped: its consumers go back to fetching on their own


async def test_critical_consumers_hear_their_topics_fast_rings_and_observers_do_not(
    channel_on: tuple[str, Redis],
) -> None:
    channel, redis = channel_on
    listener = TrafficSignal(redis, channel=channel)
    now = [100.0]
    # Another process; its fleet channel rings a topic at most every half second.
    ringer = TrafficSignal(redis, channel=channel, every_s=0.5, clock=lambda: now[0])
    pace_now = [0.0]
    critical = FetchPace(
        topics=["x.results"],
        idle_after_s=1,
        interval_s=30,
        fast_window_s=0.01,
        clock=lambda: pace_now[0],
    )
    observer = FetchPace(
        topics=["x.audit"], idle_after_s=1, interval_s=30, wake_delay_s=0.05, fast_window_s=0.01
    )
    listener.register(critical)
    listener.register(observer)
    stop = asyncio.Event()
    listening = asyncio.create_task(listener.listen(stop))
    try:

        async def rung_awake() -> bool:
            return critical.rung_awake

        await eventually(rung_awake, timeout=10)
        assert not observer.rung_awake
        # Confirmed just now: a producer whose ring found nobody a moment ago may not ring
        # again for a quarter of a second, so it fetches as if rung until then.
        assert not critical.exact
        pace_now[0] += 0.3
        assert critical.exact  # then: it fetches what the rings name
        subscribers = dict(
            await redis.pubsub_numsub(
                fast_channel(channel, "x.results"), fast_channel(channel, "x.audit")
            )
        )
        assert list(subscribers.values()) == [1, 0]
        before = critical.rings

        def rung(times: int) -> Callable[[], Awaitable[bool]]:
            async def check() -> bool:
                return critical.rings == before + times

            return check

        part = TopicPartition("x.results", 2)
        assert not critical.owed({part: 7}, {part})
        ringer.announce("x.results", 2, 7)
        await eventually(rung(2), timeout=10)  # on the fleet channel and the fast one
        assert critical.owed({part: 7}, {part})  # the fast ring said where
        assert not critical.owed({part: 8}, {part})
        now[0] += 0.01
        ringer.announce("x.results", 2, 8)
        await eventually(rung(3), timeout=10)  # on the fast channel only
        assert critical.owed({part: 8}, {part})
    finally:
        stop.set()
        await listening
        await ringer.close()
    assert not critical.rung_awake  # not listening: it polls again
