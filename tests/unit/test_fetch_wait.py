"""Fetch on demand: consumers rest once caught up and wake when a topic they read rings."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from toolfleet.bus.fetch_wait import (
    FAST_RING_EVERY_S,
    FetchPace,
    TrafficSignal,
    fast_channel,
    fetch_pace,
    fetch_waits,
    split_fetch_wait,
    traffic_channel,
    traffic_signal,
)
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Pipeline:
    def __init__(self, redis: Publishes) -> None:
        self._redis = redis
        self._queued: list[tuple[str, str]] = []

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def publish(self, channel: str, message: str) -> None:
        self._queued.append((channel, message))

    async def execute(self) -> list[int]:
        await asyncio.sleep(0)  # a round trip: rings made meanwhile wait for the next one
        if self._redis.fail:
            raise RedisConnectionError("down")
        self._redis.round_trips.append(sorted(self._queued))
        return [self._redis.listeners.get(channel, 1) for channel, _ in self._queued]


class Publishes:
    """A Redis stand-in that records each pipeline of PUBLISH calls (or fails them);
    each channel has one subscriber unless ``listeners`` says otherwise."""

    def __init__(self, *, fail: bool = False) -> None:
        self.round_trips: list[list[tuple[str, str]]] = []
        self.fail = fail
        self.listeners: dict[str, int] = {}

    def on(self, channel: str) -> list[list[str]]:
        """The topics rung on ``channel``, by round trip (those that rang it)."""
        rung = [[m for c, m in trip if c == channel] for trip in self.round_trips]
        return [topics for topics in rung if topics]

    def pipeline(self, *, transaction: bool) -> Pipeline:
        assert not transaction
        return Pipeline(self)


def pace(
    topics: tuple[str, ...] = ("t",), *, interval_s: float = 30.0, wake_delay_s: float = 0.0
) -> FetchPace:
    return FetchPace(
        topics=topics, idle_after_s=0.0, interval_s=interval_s, wake_delay_s=wake_delay_s
    )


def never() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


def test_a_consumer_rests_once_a_fetch_could_have_caught_up_and_the_idle_spell_passed() -> None:
    clock = Clock()
    waiting = FetchPace(topics=["t"], idle_after_s=1.0, interval_s=0.25, clock=clock)
    assert not waiting.should_rest()  # nothing fetched yet
    waiting.fetched(records=True)
    clock.now += 0.9
    assert not waiting.should_rest()
    clock.now += 0.2
    assert waiting.should_rest()
    waiting.awake()  # too busy to fetch: not caught up
    clock.now += 5
    assert not waiting.should_rest()
    waiting.fetched(records=False)
    assert waiting.should_rest()


def test_without_an_idle_spell_a_consumer_rests_as_soon_as_it_may_have_caught_up() -> None:
    eager = fetch_pace(FleetSettings(idle_after_ms=0), ["t"])
    assert eager is not None
    eager.fetched(records=True)
    assert eager.should_rest()  # the end offsets decide, not another fetch


async def test_end_offsets_showing_records_wake_an_observer_after_its_delay() -> None:
    observer = pace(wake_delay_s=0.05)
    observer.fetched(records=False)
    assert observer.should_rest()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await observer.records_wait(never())
    assert loop.time() - started >= 0.04
    assert not observer.should_rest()


async def test_a_ring_ends_the_rest_long_before_the_interval() -> None:
    resting = pace()
    since = resting.rings
    task = asyncio.create_task(resting.rest(never(), since=since))
    await asyncio.sleep(0)
    assert not task.done()
    resting.ring()
    assert await asyncio.wait_for(task, 1) is True


async def test_a_ring_heard_before_the_rest_began_ends_it_at_once() -> None:
    resting = pace()
    since = resting.rings  # taken before the look at the end offsets
    resting.ring()  # a record acknowledged while the consumer looked
    assert await asyncio.wait_for(resting.rest(never(), since=since), 1) is True


async def test_without_a_ring_the_rest_lasts_one_interval() -> None:
    resting = pace(interval_s=0.01)
    assert await asyncio.wait_for(resting.rest(never(), since=resting.rings), 1) is False


async def test_a_stop_ends_the_rest() -> None:
    resting = pace()
    stopped = never()
    task = asyncio.create_task(resting.rest(stopped, since=resting.rings))
    await asyncio.sleep(0)
    stopped.set_result(None)
    assert await asyncio.wait_for(task, 1) is False


async def test_an_observer_waits_after_a_ring_so_one_fetch_collects_several_hops() -> None:
    observer = pace(wake_delay_s=0.05)
    since = observer.rings
    observer.ring()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await observer.rest(never(), since=since) is True
    assert loop.time() - started >= 0.04


async def test_a_ring_wakes_this_process_s_consumers_of_that_topic_only() -> None:
    signal = TrafficSignal(Publishes(), channel="c")  # type: ignore[arg-type]
    of_a, of_b = pace(("a",)), pace(("b", "c"))
    signal.register(of_a)
    signal.register(of_b)
    signal.announce("b")
    assert (of_a.rings, of_b.rings) == (0, 1)
    signal.unregister(of_b)
    signal.announce("c")
    assert of_b.rings == 1
    await signal.close()


async def test_rings_made_during_a_round_trip_go_together_in_the_next() -> None:
    clock, redis = Clock(), Publishes()
    signal = TrafficSignal(redis, channel="c", clock=clock)  # type: ignore[arg-type]
    signal.announce("a")
    await asyncio.sleep(0)  # the first pipeline is under way
    signal.announce("b")
    signal.announce("a")
    signal.announce("b")
    await signal.close()
    await asyncio.sleep(0)
    assert redis.round_trips == [
        [("c", "a"), ("c:a", "a")],
        # "a" rang its fast channel too recently to ring it again; "b" had not.
        [("c", "a"), ("c", "b"), ("c:b", "b")],
    ]


async def test_each_send_rings_its_topic_s_fast_channel_at_most_every_two_ms() -> None:
    clock, redis = Clock(), Publishes()
    signal = TrafficSignal(redis, channel="c", every_s=0.5, clock=clock)  # type: ignore[arg-type]
    for step in (0.0, 0.001, 0.0015, 0.001):  # at 0, 1, 2.5 and 3.5 ms
        clock.now += step
        signal.announce("a")
        await signal.close()
    assert FAST_RING_EVERY_S == 0.002
    assert redis.on(fast_channel("c", "a")) == [["a"], ["a"]]  # at 0 and 2.5 ms
    assert redis.on("c") == [["a"]]  # resting consumers: once per half idle spell


async def test_a_topic_nobody_hears_fast_is_left_alone_for_a_while() -> None:
    clock, redis = Clock(), Publishes()
    redis.listeners[fast_channel("c", "audit")] = 0  # read by observers only
    signal = TrafficSignal(redis, channel="c", every_s=0.5, clock=clock)  # type: ignore[arg-type]
    for step in (0.0, 0.01, 0.2, 0.1):  # at 0, 10, 210 and 310 ms
        clock.now += step
        signal.announce("audit")
        signal.announce("results")
        await signal.close()
    assert redis.on(fast_channel("c", "audit")) == [["audit"], ["audit"]]  # at 0 and 310
    assert len(redis.on(fast_channel("c", "results"))) == 4


async def test_with_an_idle_spell_a_topic_rings_at_most_every_half_of_it() -> None:
    clock, redis = Clock(), Publishes()
    signal = TrafficSignal(redis, channel="c", every_s=0.5, clock=clock)  # type: ignore[arg-type]
    local = pace(("a",))
    signal.register(local)
    for step in (0.0, 0.2, 0.29, 0.02):  # at 0, 0.2, 0.49 and 0.51 s
        clock.now += step
        signal.announce("a")
        await signal.close()
    signal.announce("b")
    await signal.close()
    assert redis.on("c") == [["a"], ["a"], ["b"]]
    assert local.rings == 4  # this process's consumers hear every send


@pytest.mark.parametrize(("idle_after_ms", "round_trips"), [(1000, 1), (0, 2)])
async def test_a_fleet_s_rings_are_spaced_by_half_its_idle_spell(
    idle_after_ms: int, round_trips: int
) -> None:
    redis = Publishes()
    signal = traffic_signal(redis, FleetSettings(idle_after_ms=idle_after_ms))  # type: ignore[arg-type]
    assert signal is not None
    for _ in range(2):
        signal.announce("a")
        await signal.close()
    assert len(redis.on(traffic_channel(FleetSettings().topic_prefix))) == round_trips


async def test_after_a_failed_ring_redis_is_left_alone_for_a_while() -> None:
    clock, redis = Clock(), Publishes(fail=True)
    signal = TrafficSignal(redis, channel="c", clock=clock)  # type: ignore[arg-type]
    local = pace(("t",))
    signal.register(local)
    signal.announce("t")
    await signal.close()
    redis.fail = False
    signal.announce("t")  # an unreachable Redis is not asked again by every send
    await signal.close()
    assert redis.round_trips == []
    assert local.rings == 2  # this process's consumers are woken all the same
    clock.now += 1.0
    signal.announce("t")
    await signal.close()
    assert redis.round_trips == [[("c", "t"), ("c:t", "t")]]


def test_the_doorbell_can_be_switched_off_and_fleets_do_not_share_a_channel() -> None:
    off = FleetSettings(fetch_doorbell=False)
    assert traffic_signal(Publishes(), off) is None  # type: ignore[arg-type]
    assert fetch_pace(off, ["t"]) is None
    assert traffic_channel("a.") != traffic_channel("b.")


# --- waiting between fetches in the client --------------------------------------------


def test_the_broker_holds_a_fetch_at_most_its_share_and_the_client_waits_the_rest() -> None:
    assert fetch_waits(5, 1) == (1, 0.004)
    assert fetch_waits(50, 1) == (1, 0.049)
    assert fetch_waits(5, 500) == (5, 0.0)  # a Kafka that long-polls: all at the broker
    assert fetch_waits(0, 1) == (0, 0.0)
    assert fetch_waits(5, 0) == (1, 0.004)  # held 0 ms, the dev broker reads nothing
    settings = FleetSettings(fetch_max_wait_ms=20, fetch_broker_wait_ms=2)
    assert split_fetch_wait(settings, settings.fetch_max_wait_ms) == (2, 0.018)


async def test_between_fetches_the_consumer_waits_unless_a_ring_came_meanwhile() -> None:
    waiting = pace()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await waiting.between_fetches(0.03, since=waiting.rings)
    assert loop.time() - started >= 0.025

    since = waiting.rings  # taken when the fetch was sent
    waiting.ring()  # a record acknowledged while the fetch was out
    await asyncio.wait_for(waiting.between_fetches(10, since=since), 1)


async def test_a_ring_or_records_seen_waiting_cut_the_wait_between_fetches_short() -> None:
    waiting = pace()
    task = asyncio.create_task(waiting.between_fetches(10, since=waiting.rings))
    await asyncio.sleep(0)
    assert not task.done()
    waiting.ring()
    await asyncio.wait_for(task, 1)

    task = asyncio.create_task(waiting.between_fetches(10, since=waiting.rings))
    await asyncio.sleep(0)
    await waiting.records_wait(never())  # the end offsets showed records
    await asyncio.wait_for(task, 1)


def critical_pace(clock: Clock, *, interval_s: float = 0.5) -> FetchPace:
    return FetchPace(
        topics=["t"], idle_after_s=1.0, interval_s=interval_s, fast_window_s=0.01, clock=clock
    )


def test_a_consumer_that_hears_fast_rings_waits_long_outside_its_fast_window() -> None:
    clock = Clock()
    awake = critical_pace(clock)
    assert awake.critical
    assert awake.next_wait(0.004) == 0.004  # fast rings not heard yet: it polls
    awake.rung_awake = True
    assert awake.next_wait(0.004) == 0.5  # nothing lately: until a ring (or the interval)
    awake.ring()
    assert awake.next_wait(0.004) == 0.004  # a send that rang may be followed by one
    clock.now += 0.011  # that did not ring, within the window
    assert awake.next_wait(0.004) == 0.5
    awake.fetched(records=True)
    assert awake.next_wait(0.004) == 0.004
    awake.fetched(records=False)
    clock.now += 0.011
    assert awake.next_wait(0.004) == 0.5


def test_observers_and_consumers_of_a_fleet_without_fast_rings_keep_polling() -> None:
    clock = Clock()
    observer = FetchPace(
        topics=["t"], idle_after_s=1.0, interval_s=0.5, wake_delay_s=0.05,
        fast_window_s=0.01, clock=clock,
    )  # fmt: skip
    assert not observer.critical
    settings = FleetSettings(fetch_max_wait_ms=5)
    critical = fetch_pace(settings, ["t"])
    assert critical is not None
    assert critical.critical
    assert critical.fast_window_s == pytest.approx(FAST_RING_EVERY_S + 0.005 + 0.003)


async def test_partitions_fetchable_again_end_a_long_wait_a_ring_was_spent_on() -> None:
    clock = Clock()
    awake = critical_pace(clock, interval_s=30)
    awake.rung_awake = True
    awake.ring()  # spent on a fetch that left out the partition whose records were buffered
    clock.now += 0.02
    for freed in (lambda: awake.fetched(records=True), awake.fetchable):  # taken; resumed
        task = asyncio.create_task(awake.between_fetches(0.004, since=awake.rings))
        await asyncio.sleep(0)
        assert not task.done()  # outside its window: a long wait
        freed()
        await asyncio.wait_for(task, 1)
        clock.now += 0.02
