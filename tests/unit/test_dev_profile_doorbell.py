"""The dev profile's doorbell: consumers rest once caught up and wake when a topic they read
rings; the wait between fetches moves from the dev broker to the client."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace, TracebackType
from typing import Any, Self

import pytest
from aiokafka import TopicPartition
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.support.eventually import eventually
from toolfleet.bus.profile import PacingInput
from toolfleet.devstack.broker_profile import DevBrokerProfile, DevBrokerSettings, DoorbellPacing
from toolfleet.devstack.broker_profile.client_wait import fetch_waits, wait_in_client
from toolfleet.devstack.broker_profile.doorbell import (
    FAST_RING_EVERY_S,
    FetchPace,
    TrafficSignal,
    fast_channel,
    fast_ring,
    fetch_pace,
    parse_ring,
    traffic_channel,
    traffic_signal,
)

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
    eager = fetch_pace(DevBrokerSettings(idle_after_ms=0), ["t"])
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


async def test_quiet_rests_look_twice_as_long_apart_up_to_the_cap_until_a_ring() -> None:
    resting = FetchPace(topics=["t"], idle_after_s=0.0, interval_s=0.02, look_max_s=0.08)
    loop = asyncio.get_running_loop()

    async def rest_lasts() -> float:
        started = loop.time()
        assert await resting.rest(never(), since=resting.rings) is False
        return loop.time() - started

    lasted = [await rest_lasts() for _ in range(4)]
    # 20, 40, 80, 80 ms: an idle fleet asks the broker less and less often, up to the cap.
    assert lasted[0] < 0.035 <= lasted[1] < 0.07 <= lasted[2]
    assert lasted[3] < 0.12
    resting.ring()
    assert await resting.rest(never(), since=resting.rings - 1) is True
    assert await rest_lasts() < 0.035  # a ring starts over from the first spacing


def test_the_dev_profile_backs_its_looks_off_to_the_setting() -> None:
    made = fetch_pace(DevBrokerSettings(idle_fetch_interval_ms=500, idle_look_max_ms=4000), ["t"])
    assert made is not None
    assert (made.interval_s, made.look_max_s) == (0.5, 4.0)
    # A cap below the first spacing never shortens it.
    low = fetch_pace(DevBrokerSettings(idle_fetch_interval_ms=500, idle_look_max_ms=100), ["t"])
    assert low is not None
    assert low.look_max_s == 0.5


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


async def rung(signal: TrafficSignal) -> None:
    """Let the ring under way finish (the stand-in's round trip is one loop turn)."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_rings_made_during_a_round_trip_go_together_in_the_next() -> None:
    clock, redis = Clock(), Publishes()
    signal = TrafficSignal(redis, channel="c", clock=clock)  # type: ignore[arg-type]
    signal.announce("a", 0, 5)
    await asyncio.sleep(0)  # the first pipeline is under way
    signal.announce("b", 1, 7)
    signal.announce("a", 0, 6)
    signal.announce("b", 1, 8)
    await rung(signal)
    assert redis.round_trips == [
        [("c", "a"), ("c:a", "a 0:5")],
        # "a" rang its fast channel too recently to ring it again; "b" had not, and its
        # ring names the last offset acknowledged.
        [("c", "a"), ("c", "b"), ("c:b", "b 1:8")],
    ]
    await signal.close()  # a closing producer rings what waited for the spell's end
    assert redis.round_trips[-1] == [("c:a", "a 0:6")]


async def test_a_fast_ring_names_each_partition_s_last_offset_at_most_every_two_ms() -> None:
    clock, redis = Clock(), Publishes()
    signal = TrafficSignal(redis, channel="c", every_s=0.5, clock=clock)  # type: ignore[arg-type]
    for step, partition, offset in ((0.0, 0, 1), (0.001, 0, 2), (0.0, 3, 9), (0.0015, 0, 4)):
        clock.now += step  # at 0, 1, 1 and 2.5 ms
        signal.announce("a", partition, offset)
        await rung(signal)
    assert FAST_RING_EVERY_S == 0.002
    # The sends at 1 ms go in the ring at 2.5 ms, with the newest offset of partition 0.
    assert redis.on(fast_channel("c", "a")) == [["a 0:1"], ["a 0:4,3:9"]]
    assert redis.on("c") == [["a"]]  # resting consumers: once per half idle spell


async def test_marks_left_within_a_spell_ring_at_its_end_without_another_send() -> None:
    clock, redis = Clock(), Publishes()
    signal = TrafficSignal(redis, channel="c", clock=clock)  # type: ignore[arg-type]
    signal.announce("a", 0, 1)
    await rung(signal)
    clock.now += FAST_RING_EVERY_S / 2
    signal.announce("a", 0, 2)  # within the spell: no ring now
    await rung(signal)
    assert redis.on(fast_channel("c", "a")) == [["a 0:1"]]
    clock.now += FAST_RING_EVERY_S  # the spell is over; its end's timer rings the mark

    async def trailing_ring() -> bool:
        await rung(signal)
        return redis.on(fast_channel("c", "a")) == [["a 0:1"], ["a 0:2"]]

    await eventually(trailing_ring, timeout=5.0, interval=0.001)
    await signal.close()


def test_a_ring_s_message_reads_back_and_a_foreign_one_only_wakes() -> None:
    assert parse_ring(fast_ring("t", {2: 10, 0: 3})) == ("t", {0: 3, 2: 10})
    assert parse_ring("t") == ("t", None)  # the fleet channel's: no marks
    assert parse_ring("t ") == ("t", {})  # a fast ring that does not say where
    assert parse_ring("t 1:x") == ("t", {})


async def test_a_topic_nobody_hears_fast_is_left_alone_for_a_while() -> None:
    clock, redis = Clock(), Publishes()
    redis.listeners[fast_channel("c", "audit")] = 0  # read by observers only
    signal = TrafficSignal(redis, channel="c", every_s=0.5, clock=clock)  # type: ignore[arg-type]
    for step in (0.0, 0.01, 0.2, 0.1):  # at 0, 10, 210 and 310 ms
        clock.now += step
        signal.announce("audit", 0, int(clock.now * 1000))
        signal.announce("results", 0, int(clock.now * 1000))
        await rung(signal)
    assert len(redis.on(fast_channel("c", "audit"))) == 2  # at 0 and 310
    assert len(redis.on(fast_channel("c", "results"))) == 4
    await signal.close()


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
    signal = traffic_signal(redis, DevBrokerSettings(idle_after_ms=idle_after_ms))  # type: ignore[arg-type]
    assert signal is not None
    for _ in range(2):
        signal.announce("a")
        await signal.close()
    assert len(redis.on(traffic_channel(DevBrokerSettings().topic_prefix))) == round_trips


async def test_after_a_failed_ring_redis_is_left_alone_for_a_while() -> None:
    clock, redis = Clock(), Publishes(fail=True)
    signal = TrafficSignal(redis, channel="c", clock=clock)  # type: ignore[arg-type]
    local = pace(("t",))
    signal.register(local)
    signal.announce("t", 0, 1)
    await rung(signal)
    redis.fail = False
    clock.now += 0.01
    signal.announce("t", 0, 2)  # an unreachable Redis is not asked again by every send
    await rung(signal)
    assert redis.round_trips == []
    assert local.rings == 2  # this process's consumers are woken all the same
    clock.now += 1.0
    signal.announce("t", 0, 3)
    await signal.close()
    assert redis.round_trips == [[("c", "t"), ("c:t", "t 0:3")]]


def test_the_doorbell_can_be_switched_off_and_fleets_do_not_share_a_channel() -> None:
    off = DevBrokerSettings(fetch_doorbell=False)
    assert traffic_signal(Publishes(), off) is None  # type: ignore[arg-type]
    assert fetch_pace(off, ["t"]) is None
    assert DevBrokerProfile.open(off, redis=Publishes()).announcer is None  # type: ignore[arg-type]
    assert DevBrokerProfile.open(DevBrokerSettings(), doorbell=False).announcer is None
    assert traffic_channel("a.") != traffic_channel("b.")


# --- waiting between fetches in the client --------------------------------------------


def test_the_broker_holds_a_fetch_at_most_its_share_and_the_client_waits_the_rest() -> None:
    assert fetch_waits(5, 1) == (1, 0.004)
    assert fetch_waits(50, 1) == (1, 0.049)
    assert fetch_waits(5, 500) == (5, 0.0)  # a Kafka that long-polls: all at the broker
    assert fetch_waits(0, 1) == (0, 0.0)
    assert fetch_waits(5, 0) == (1, 0.004)  # held 0 ms, the dev broker reads nothing
    profile = DevBrokerProfile(
        DevBrokerSettings(
            fetch_max_wait_ms=20, fetch_broker_wait_ms=2, observer_fetch_max_wait_ms=40
        )
    )
    critical = profile.pacing(PacingInput(topics=frozenset({"t"})))
    observer = profile.pacing(PacingInput(topics=frozenset({"t"}), observer=True))
    assert isinstance(critical, DoorbellPacing)
    assert isinstance(observer, DoorbellPacing)
    assert critical.broker_wait_ms == observer.broker_wait_ms == 2
    assert critical.client_wait_s == pytest.approx(0.018)
    assert observer.client_wait_s == pytest.approx(0.038)


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


def critical_pace(clock: Clock | None = None, *, interval_s: float = 0.5) -> FetchPace:
    return FetchPace(
        topics=["t"],
        idle_after_s=1.0,
        interval_s=interval_s,
        fast_window_s=0.01,
        clock=clock if clock is not None else time.monotonic,
    )


T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


def test_a_consumer_that_hears_fast_rings_fetches_only_what_they_name() -> None:
    clock = Clock()
    awake = critical_pace(clock)
    assert awake.critical
    assert not awake.exact  # fast rings not heard yet: it polls
    awake.rung_awake = True
    assert awake.exact
    assigned = {T0, T1}
    assert not awake.owed({T0: 5, T1: 0}, assigned)  # nothing rung: hold the fetch
    awake.ring("t", {0: 5})  # the record at offset 5 of partition 0 was acknowledged
    assert awake.owed({T0: 5, T1: 0}, assigned)
    assert awake.owed({T0: 5, T1: 0}, assigned)  # an empty answer settles nothing
    assert not awake.owed({T1: 0}, assigned)  # partition 0 left out (records buffered)
    assert not awake.owed({T0: 6, T1: 0}, assigned)  # fetched past it: settled
    assert not awake.owed({T0: 5, T1: 0}, assigned)
    awake.ring("t", {1: 3})
    assert not awake.owed({T0: 6}, {T0})  # partition 1 no longer assigned: forgotten
    assert not awake.owed({T0: 6, T1: 0}, assigned)


def test_rings_of_a_quiet_topic_are_ignored() -> None:
    awake = critical_pace()
    awake.rung_awake = True
    awake.quiet_topics = frozenset({"t"})  # its records come with fetches of the others
    awake.ring("t", {0: 5})
    assert awake.rings == 0
    assert not awake.owed({T0: 5}, {T0})
    awake.quiet_topics = frozenset()
    awake.ring("t", {0: 5})
    assert awake.owed({T0: 5}, {T0})


def test_a_fast_ring_that_does_not_say_where_and_a_new_subscription_poll_for_a_while() -> None:
    clock = Clock()
    awake = critical_pace(clock)
    awake.rung_awake = True
    awake.ring("t", None)  # the fleet channel's ring: wakes, says nothing
    assert awake.exact
    awake.ring("t", {})  # a send whose offset was not known
    assert not awake.exact
    clock.now += 0.011
    assert awake.exact
    awake.keep_fast(0.3)  # just subscribed: rings may not reach it for a while
    clock.now += 0.2
    assert not awake.exact


def test_observers_and_consumers_of_a_fleet_without_fast_rings_keep_polling() -> None:
    clock = Clock()
    observer = FetchPace(
        topics=["t"], idle_after_s=1.0, interval_s=0.5, wake_delay_s=0.05,
        fast_window_s=0.01, clock=clock,
    )  # fmt: skip
    assert not observer.critical
    observer.rung_awake = True  # never set for an observer; and if it were:
    assert observer.spacing(0.05) == 0  # at most one fetch every 50 ms
    clock.now += 0.02
    assert observer.spacing(0.05) == pytest.approx(0.03)
    clock.now += 0.03
    assert observer.spacing(0.05) == pytest.approx(0.05)
    settings = DevBrokerSettings(fetch_max_wait_ms=5)
    critical = fetch_pace(settings, ["t"])
    assert critical is not None
    assert critical.critical
    assert critical.fast_window_s == pytest.approx(FAST_RING_EVERY_S + 0.005 + 0.003)


async def test_a_hold_ends_with_a_ring_or_partitions_freed_and_lasts_one_interval_else() -> None:
    awake = critical_pace(interval_s=30)
    for end in (lambda: awake.ring("t", {0: 1}), awake.fetchable):
        task = asyncio.create_task(awake.hold(since=awake.rings))
        await asyncio.sleep(0)
        assert not task.done()
        end()
        assert await asyncio.wait_for(task, 1) is True
    brief = critical_pace(interval_s=0.01)
    assert await asyncio.wait_for(brief.hold(since=brief.rings), 1) is False


class Fetcher:
    """aiokafka's fetcher as :func:`wait_in_client` sees it: one request per call."""

    def __init__(self) -> None:
        self.sent: list[dict[TopicPartition, int]] = []
        self.held_ms: list[int | None] = []
        """How long the broker may hold each request sent (aiokafka's ``_max_wait_ms``)."""
        self.found: list[bool] = []
        self._closed = False

    async def _proc_fetch_request(self, assignment: object, node_id: int, request: Any) -> bool:
        self.sent.append({TopicPartition(t, p): o for t, ps in request.topics for p, o, _ in ps})
        self.held_ms.append(getattr(request, "_max_wait_ms", None))
        return self.found.pop(0) if self.found else False


class Assignment:
    """aiokafka's assignment as the fetcher's requests see it: each partition's state,
    with the high watermark its last fetch reported."""

    def __init__(self, *tps: TopicPartition, ends: dict[TopicPartition, int] | None = None):
        self.tps = set(tps)
        self.ends = ends if ends is not None else {}

    def state_value(self, tp: TopicPartition) -> SimpleNamespace:
        return SimpleNamespace(highwater=self.ends.get(tp))


def request(**offsets: int) -> SimpleNamespace:
    """A fetch request as aiokafka builds it: held 1 ms at the broker (the dev profile's)."""
    return SimpleNamespace(
        topics=[("t", [(int(p[1:]), o, 1024) for p, o in offsets.items()])], _max_wait_ms=1
    )


def exact_consumer() -> tuple[FetchPace, Fetcher]:
    """A consumer on the critical path whose fast rings are heard, and its fetcher."""
    awake = critical_pace(interval_s=30)
    awake.rung_awake = True
    fetcher = Fetcher()
    wait_in_client(SimpleNamespace(_fetcher=fetcher), 0.004, awake)  # type: ignore[arg-type]
    return awake, fetcher


async def test_an_exact_consumer_sends_a_fetch_only_when_a_ring_named_its_records() -> None:
    awake, fetcher = exact_consumer()
    fetch = fetcher._proc_fetch_request
    assignment = Assignment(T0, T1, ends={T0: 5, T1: 0})  # caught up, as last reported

    held = asyncio.create_task(fetch(assignment, 0, request(p0=5, p1=0)))
    await asyncio.sleep(0.01)
    assert fetcher.sent == []
    assert not held.done()
    awake.ring("t", {0: 5})
    assert await asyncio.wait_for(held, 1) is False  # the fetcher builds it anew
    assert fetcher.sent == []

    # The busy dev broker answers without the record: asked again, after the short wait.
    fetcher.found = [False, True]
    assert await fetch(assignment, 0, request(p0=5, p1=0)) is False
    assert await fetch(assignment, 0, request(p0=5, p1=0)) is True
    assert fetcher.sent == [{T0: 5, T1: 0}] * 2

    # Taken: partition 0 is past the mark, and the next request is held again.
    assignment.ends[T0] = 6
    held = asyncio.create_task(fetch(assignment, 0, request(p0=6, p1=0)))
    await asyncio.sleep(0.01)
    assert len(fetcher.sent) == 2
    assert not held.done()
    fetcher._closed = True
    held.cancel()
    assert await held is False  # a cancelled request ends as an empty fetch


async def test_records_nobody_rang_are_read_while_a_fetch_reports_more() -> None:
    _, fetcher = exact_consumer()  # and no ring at all
    fetch = fetcher._proc_fetch_request
    # Just assigned: nothing fetched yet, so nothing known of the partition's end.
    assignment = Assignment(T0)
    fetcher.found = [True, True]
    assert await fetch(assignment, 0, request(p0=0)) is True
    # A backlog published before this consumer had the partition: its last fetch
    # reported the end at 900, so it keeps fetching without a ring...
    assignment.ends[T0] = 900
    assert await fetch(assignment, 0, request(p0=500)) is True
    assert len(fetcher.sent) == 2
    # ...until it has read up to the end.
    assignment.ends[T0] = 900
    held = asyncio.create_task(fetch(assignment, 0, request(p0=900)))
    await asyncio.sleep(0.01)
    assert len(fetcher.sent) == 2
    assert not held.done()
    held.cancel()
    assert await held is False


async def test_an_observer_fetches_at_most_once_per_its_wait_rings_or_not() -> None:
    observer = pace(wake_delay_s=0.05)
    observer.fast_window_s = 0.01
    fetcher = Fetcher()
    wait_in_client(SimpleNamespace(_fetcher=fetcher), 0.03, observer)  # type: ignore[arg-type]
    assignment = Assignment(T0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    fetcher.found = [True]
    await fetcher._proc_fetch_request(assignment, 0, request(p0=0))  # records
    second = asyncio.create_task(fetcher._proc_fetch_request(assignment, 0, request(p0=1)))
    await asyncio.sleep(0)
    observer.ring("t", None)
    observer.fetchable()
    await second
    assert loop.time() - started >= 0.025
    assert len(fetcher.sent) == 2


async def test_a_fetch_known_to_find_records_is_held_longer_at_the_broker() -> None:
    """The dev broker takes longer to find an offset the deeper its partition: held 1 ms,
    a fetch at the end of a few thousand batches comes back empty every time."""
    awake = critical_pace(interval_s=30)
    awake.rung_awake = True
    fetcher = Fetcher()
    wait_in_client(SimpleNamespace(_fetcher=fetcher), 0.004, awake, found_wait_ms=100)  # type: ignore[arg-type]
    fetch = fetcher._proc_fetch_request
    assignment = Assignment(T0, T1, ends={T0: 5, T1: 0})

    # A ring names partition 0's record at offset 5; the fetch is sent as built, and the
    # deep partition's broker answers before it reached the record...
    awake.ring("t", {0: 5})
    assert await fetch(assignment, 0, request(p0=5, p1=0)) is False
    # ...reporting the end past the offset: the next fetch is held up to 100 ms.
    assignment.ends[T0] = 6
    fetcher.found = [True]
    assert await fetch(assignment, 0, request(p0=5, p1=0)) is True
    # Its last fetch reported partition 1's end at 40: the fetch from 7 is known too.
    assignment.ends.update({T0: 6, T1: 40})
    fetcher.found = [True]
    assert await fetch(assignment, 0, request(p0=6, p1=7)) is True
    assert fetcher.held_ms == [1, 100, 100]


async def test_a_ring_naming_records_never_written_never_holds_a_fetch_longer() -> None:
    """Whoever can publish on the fleet's Redis can ring a mark far past a partition's
    end (a hostile or a stale ring): its fetches are sent as built, held 1 ms at the
    broker, and the longer hold does not grow."""
    awake = critical_pace(interval_s=30)
    awake.rung_awake = True
    fetcher = Fetcher()
    wait_in_client(SimpleNamespace(_fetcher=fetcher), 0.001, awake, found_wait_ms=100)  # type: ignore[arg-type]
    fetch = fetcher._proc_fetch_request
    assignment = Assignment(T0, ends={T0: 5})
    awake.ring("t", {0: 1_000_000})
    for _ in range(3):
        assert await fetch(assignment, 0, request(p0=5)) is False
    assignment.ends[T0] = 9  # a real record: held longer, at 100 ms still
    fetcher.found = [True]
    assert await fetch(assignment, 0, request(p0=5)) is True
    assert fetcher.held_ms == [1, 1, 1, 100]


async def test_a_known_fetch_that_came_back_empty_keeps_the_same_hold() -> None:
    """A partition deeper than the broker reads in the hold, or a fetch wrongly taken for
    known: the hold stays bounded, so no fetch holds up the consumer's other partitions
    for longer each time."""
    fetcher = Fetcher()
    wait_in_client(SimpleNamespace(_fetcher=fetcher), 0.0, found_wait_ms=100)  # type: ignore[arg-type]
    fetch = fetcher._proc_fetch_request
    behind = Assignment(T0, ends={T0: 50_000})
    for _ in range(3):
        assert await fetch(behind, 0, request(p0=10)) is False
    fetcher.found = [True]
    assert await fetch(behind, 0, request(p0=10)) is True
    # Caught up: not known, sent as built.
    assert await fetch(Assignment(T0, ends={T0: 10}), 0, request(p0=10)) is False
    assert fetcher.held_ms == [100, 100, 100, 100, 1]


async def test_an_observer_s_fetch_behind_the_end_is_held_longer_and_others_keep_their_hold() -> (
    None
):
    observer = pace(wake_delay_s=0.05)
    fetcher = Fetcher()
    wait_in_client(SimpleNamespace(_fetcher=fetcher), 0.001, observer, found_wait_ms=100)  # type: ignore[arg-type]
    fetch = fetcher._proc_fetch_request
    await fetch(Assignment(T0), 0, request(p0=0))  # nothing known of the end yet
    await fetch(Assignment(T0, ends={T0: 900}), 0, request(p0=0))
    # An aiokafka whose requests carry no ``_max_wait_ms``: sent as built.
    bare = SimpleNamespace(topics=[("t", [(0, 0, 1024)])])
    await fetch(Assignment(T0, ends={T0: 900}), 0, bare)
    assert fetcher.held_ms == [1, 100, None]
    assert not hasattr(bare, "_max_wait_ms")


async def test_with_the_longer_hold_off_every_fetch_is_sent_as_built() -> None:
    fetcher = Fetcher()
    wait_in_client(SimpleNamespace(_fetcher=fetcher), 0.001, found_wait_ms=0)  # type: ignore[arg-type]
    assert (
        await fetcher._proc_fetch_request(Assignment(T0, ends={T0: 900}), 0, request(p0=0)) is False
    )
    assert fetcher.held_ms == [1]
