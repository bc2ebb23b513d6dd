"""Adaptive fetching: consumers rest after an idle spell and wake on announced traffic."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from toolfleet.bus.fetch_wait import FetchPace, TrafficSignal, traffic_channel, traffic_signal
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Publishes:
    """A Redis stand-in that records PUBLISH calls (or fails them)."""

    def __init__(self, *, fail: bool = False) -> None:
        self.sent: list[tuple[str, str]] = []
        self.fail = fail

    async def publish(self, channel: str, message: str) -> int:
        if self.fail:
            raise RedisConnectionError("down")
        self.sent.append((channel, message))
        return 1


def test_a_consumer_rests_only_after_the_idle_spell() -> None:
    clock = Clock()
    pace = FetchPace(idle_after_s=1.0, interval_s=0.25, clock=clock)
    clock.now += 0.9
    assert not pace.should_rest()
    pace.saw_traffic()
    clock.now += 0.9
    assert not pace.should_rest()
    clock.now += 0.2
    assert pace.should_rest()


async def test_a_wake_ends_the_rest_long_before_the_interval() -> None:
    clock = Clock()
    pace = FetchPace(idle_after_s=1.0, interval_s=30.0, clock=clock)
    clock.now += 5
    assert pace.should_rest()
    stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    resting = asyncio.create_task(pace.rest(stopped))
    await asyncio.sleep(0)
    assert not resting.done()
    pace.wake()
    await asyncio.wait_for(resting, 1)
    assert not pace.should_rest()  # awake for a whole idle spell after a wake


async def test_a_stop_ends_the_rest() -> None:
    pace = FetchPace(idle_after_s=1.0, interval_s=30.0)
    stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    resting = asyncio.create_task(pace.rest(stopped))
    await asyncio.sleep(0)
    stopped.set_result(None)
    await asyncio.wait_for(resting, 1)


async def test_without_a_wake_the_rest_lasts_one_interval() -> None:
    pace = FetchPace(idle_after_s=0.0, interval_s=0.01)
    stopped: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    await asyncio.wait_for(pace.rest(stopped), 1)


async def test_announcements_are_sent_once_per_half_idle_spell_per_topic() -> None:
    clock, redis = Clock(), Publishes()
    signal = TrafficSignal(redis, channel="c", idle_after_s=1.0, clock=clock)  # type: ignore[arg-type]
    signal.announce("a")
    signal.announce("a")
    signal.announce("b")
    clock.now += 0.49
    signal.announce("a")
    clock.now += 0.02
    signal.announce("a")
    await signal.close()
    assert redis.sent == [("c", "a"), ("c", "b"), ("c", "a")]


async def test_an_announcement_wakes_this_process_s_resting_consumers_at_once() -> None:
    clock = Clock()
    signal = TrafficSignal(Publishes(), channel="c", idle_after_s=1.0, clock=clock)  # type: ignore[arg-type]
    pace = FetchPace(idle_after_s=1.0, interval_s=30.0, clock=clock)
    signal.register(pace)
    clock.now += 5
    assert pace.should_rest()
    signal.announce("t")
    assert not pace.should_rest()
    signal.unregister(pace)
    clock.now += 5
    signal.announce("u")
    assert pace.should_rest()
    await signal.close()


async def test_a_failed_announcement_is_tried_again_after_half_a_spell() -> None:
    clock, redis = Clock(), Publishes(fail=True)
    signal = TrafficSignal(redis, channel="c", idle_after_s=1.0, clock=clock)  # type: ignore[arg-type]
    signal.announce("t")
    await signal.close()
    redis.fail = False
    signal.announce("t")  # an unreachable Redis is not hammered by every send
    await signal.close()
    assert redis.sent == []
    clock.now += 0.5
    signal.announce("t")
    await signal.close()
    assert redis.sent == [("c", "t")]


def test_resting_can_be_switched_off_and_fleets_do_not_share_a_channel() -> None:
    off = FleetSettings(idle_after_ms=0)
    assert traffic_signal(Publishes(), off) is None  # type: ignore[arg-type]
    assert traffic_channel("a.") != traffic_channel("b.")
