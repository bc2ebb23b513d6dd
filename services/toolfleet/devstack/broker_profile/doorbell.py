"""The dev profile's doorbell: a consumer that has caught up rests until a topic it reads rings.

A Kafka long-polls: a fetch waits at the broker and returns the moment a record lands.
The dev broker does not wake a waiting fetch, and each fetch request costs it about
half a millisecond of CPU whether it finds records or not, so a fleet of consumers
polling every ``fetch_max_wait_ms`` (5 ms) keeps it busy for nothing and makes every hop
queue for CPU. So, with ``TOOLFLEET_FETCH_DOORBELL`` on (the dev profile's default):

- every producer of the fleet (workers and ``KafkaPublisher``) **rings** a topic once
  the broker has acknowledged a send to it: one Redis ``PUBLISH`` of the topic name on
  the fleet's channel, the rings of sends acknowledged together in one pipeline, at most
  once per topic every ``TOOLFLEET_IDLE_AFTER_MS / 2`` (every send when that is 0);
- a consumer that has fetched no records for ``TOOLFLEET_IDLE_AFTER_MS`` (1 s; 0: as
  soon as a fetch returned) **rests**: its partitions are paused and it sends no fetch
  requests. Each worker's :class:`TrafficSignal` listener rings the
  :class:`FetchPace` of every consumer of the topic, which then fetches again: the
  record is on the broker by then, so that fetch returns it without waiting;
- a resting consumer also compares its partitions' end offsets with its positions (one
  ``ListOffsets`` request, no fetch) on entering the rest, and every
  ``TOOLFLEET_IDLE_FETCH_INTERVAL_MS`` after that, twice as long apart after each look
  that found nothing, up to ``TOOLFLEET_IDLE_LOOK_MAX_MS`` (a fleet idle for minutes
  asks the broker every few seconds, not twice a second per consumer).

Why no record waits for the interval: a rest is entered with the count of rings heard
so far; it ends at once if that count moved since. A record acknowledged before that
count was taken is on the broker before the end-offset look that follows, which sees it;
one acknowledged after rings after, and that ring ends the rest. A send that does not
ring (its topic rang less than ``idle_after / 2`` before) follows a ring that woke every
consumer of the topic, which then stays awake for ``idle_after`` at least: long enough
to find it by fetching, or by the look that begins its next rest. A ring is only a
hint: one lost (a producer that does not ring, such as a foreign Kafka client) costs
at most one look's spacing of latency (``TOOLFLEET_IDLE_LOOK_MAX_MS`` once idle), never
a record; while Redis is away consumers do not rest. Offsets, commits and
redelivery are untouched.

A consumer off the critical path (audit, status) waits ``wake_delay_s`` after a ring
before fetching, so one fetch collects the records of several hops.

**Rung awake, exactly.** Those rings wake resting consumers, but a consumer that is awake
(traffic in the last ``idle_after``) used to find its records by fetching every
``fetch_max_wait_ms``: at one call in flight, five consumers fetching every 5 ms cost the
dev broker about 25 fetches per call, most of them empty, and the CPU they took made
every hop wait for a core. So each topic also rings on its own *fast* channel
(:func:`fast_channel`), and the ring says where the records are: the offset of the last
record acknowledged on each partition (*marks*, ``"<topic> <partition>:<offset>,..."``).
A producer rings a topic's fast channel at most once every :data:`FAST_RING_EVERY_S`;
marks acknowledged meanwhile go out in one ring at the end of that spell, so every
acknowledged record is named by a ring within :data:`FAST_RING_EVERY_S`. The consumers on
the critical path (policy, executor, validator, the client's watcher) subscribe to the
fast channels of their topics and, once that is confirmed (:attr:`FetchPace.exact`),
send a fetch only when it is *owed* a record: a partition it names has a mark at or past
the offset it fetches from, or lies behind the high watermark its last fetch reported
(a backlog nobody rang, a partition just assigned). Otherwise the request is held
until a ring or partitions freed (records taken, partitions resumed), and sent anyway after
``TOOLFLEET_IDLE_FETCH_INTERVAL_MS`` (a ring may be lost). A fetch that comes back
without an owed record (a busy dev broker answers a fetch it holds 1 ms without having
read every partition) is sent again after ``fetch_max_wait_ms``: marks are settled by
positions, never by time, and no end-offset look is needed. So a record costs each of
its consumers one fetch, and a ring without a record for it costs nothing.
Nobody subscribes to the fast channels of the topics only observers read: a producer
whose fast ring reached no one leaves that topic's fast channel alone for
:data:`_UNHEARD_QUIET_S`, and a consumer whose subscription is confirmed fetches every
``fetch_max_wait_ms`` for that long first. Observers keep the rings of the fleet channel,
and fetch at most once every ``TOOLFLEET_OBSERVER_FETCH_MAX_WAIT_MS`` while awake: one
fetch collects the records of several hops, and rings do not cut that short.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from toolfleet.devstack.broker_profile.settings import DevBrokerSettings
from toolfleet.storage.pubsub import listen_with_reconnect

log = logging.getLogger(__name__)

_QUIET_AFTER_FAILURE_S = 1.0
"""After a ring failed to reach Redis, rings are not sent for this long (local consumers
are still woken): a client without a reachable Redis is not slowed by every send."""

FAST_RING_EVERY_S = 0.002
"""A producer rings a topic's fast channel at most this often: at saturation the rings of
one topic are bounded whatever the rate of sends. Marks acknowledged meanwhile ring at the
end of the spell."""

_FAST_WINDOW_MARGIN_S = 0.003
"""Added to a fast window beyond its :data:`FAST_RING_EVERY_S` and one fetch wait: a ring
handled late, a fetch answered late."""

Marks = Mapping[int, int]
"""Partition -> offset of the last record acknowledged there (a fast ring's payload)."""

_UNHEARD_QUIET_S = 0.25
"""A fast ring that reached no subscriber (a topic only observers read) is not sent
again on that topic for this long."""


def traffic_channel(topic_prefix: str) -> str:
    """The pub/sub channel a fleet's topics ring on (the message is the topic's name)."""
    return f"toolfleet:traffic:{topic_prefix}"


def fast_channel(channel: str, topic: str) -> str:
    """The channel ``topic`` rings on for the awake consumers on the critical path."""
    return f"{channel}:{topic}"


def fast_ring(topic: str, marks: Marks) -> str:
    """A fast ring's message: ``"<topic> <partition>:<offset>,..."``."""
    return f"{topic} " + ",".join(f"{p}:{o}" for p, o in sorted(marks.items()))


def parse_ring(message: str) -> tuple[str, dict[int, int] | None]:
    """The topic and marks of a ring: None for a ring of the fleet channel (it wakes
    resting consumers), ``{}`` for a fast ring that does not say where."""
    topic, fast, rest = message.partition(" ")
    if not fast:
        return topic, None
    marks: dict[int, int] = {}
    if rest:
        try:
            for item in rest.split(","):
                partition, _, offset = item.partition(":")
                marks[int(partition)] = int(offset)
        except ValueError:
            return topic, {}
    return topic, marks


def traffic_signal(redis: Redis, settings: DevBrokerSettings) -> TrafficSignal | None:
    """The fleet's :class:`TrafficSignal` over ``redis``; None when the doorbell is off."""
    if not settings.fetch_doorbell:
        return None
    return TrafficSignal(
        redis,
        channel=traffic_channel(settings.topic_prefix),
        every_s=settings.idle_after_ms / 2000,
    )


def fetch_pace(
    settings: DevBrokerSettings, topics: Iterable[str], *, wake_delay_s: float = 0.0
) -> FetchPace | None:
    """The :class:`FetchPace` of a consumer of ``topics``; None when the doorbell is off."""
    if not settings.fetch_doorbell:
        return None
    return FetchPace(
        topics=topics,
        idle_after_s=settings.idle_after_ms / 1000,
        interval_s=settings.idle_fetch_interval_ms / 1000,
        look_max_s=settings.idle_look_max_ms / 1000,
        wake_delay_s=wake_delay_s,
        fast_window_s=FAST_RING_EVERY_S + settings.fetch_max_wait_ms / 1000 + _FAST_WINDOW_MARGIN_S,
    )


def behind_reported_end(
    offsets: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int | None]
) -> bool:
    """Whether a fetch from ``offsets`` starts before a partition's end as the broker's
    last answer reported it (``ends``: high watermarks, None where none was reported):
    records the broker itself said are there."""
    return any((end := ends.get(tp)) is not None and start < end for tp, start in offsets.items())


class FetchPace:
    """Whether one consumer fetches or rests, and what ends its rest.

    Args:
        topics: the topics it reads; a ring of any of them ends a rest.
        idle_after_s: rest once caught up for this long (0: as soon as caught up).
        interval_s: while resting, look at the end offsets this often at first.
        look_max_s: each rest that ends with nothing found doubles that spacing, up to
            this (default: ``interval_s``, no backing off); a ring or records reset it.
        wake_delay_s: after a ring, wait this long before fetching (batches the records
            of several hops into one fetch; 0 for consumers on the critical path, which
            listen to the fast rings of their topics).
        fast_window_s: how long a consumer on the critical path is sized to keep fetching
            every ``fetch_max_wait_ms`` after its fast channels are confirmed (beyond
            :data:`_UNHEARD_QUIET_S`); 0 for observers, which hear no fast rings.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        *,
        topics: Iterable[str],
        idle_after_s: float,
        interval_s: float,
        look_max_s: float | None = None,
        wake_delay_s: float = 0.0,
        fast_window_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.topics = frozenset(topics)
        self.idle_after_s = idle_after_s
        self.interval_s = interval_s
        self.look_max_s = interval_s if look_max_s is None else max(look_max_s, interval_s)
        self._look_every_s = interval_s
        """The current spacing of a rest's looks (doubles while they find nothing)."""
        self.wake_delay_s = wake_delay_s
        self.fast_window_s = fast_window_s
        self.rung_awake = False
        """Whether the fast rings of every topic it reads reach it (set by
        :class:`TrafficSignal` once subscribed): only then may it wait long while awake."""
        self._clock = clock
        self.quiet_topics: frozenset[str] = frozenset()
        """Topics whose rings it ignores: their records come with its next fetch of the
        others (the client's watcher reads progress events only when someone waits)."""
        self._fast_until = float("-inf")
        self._marks: dict[TopicPartition, int] = {}
        """Offsets rung (last acknowledged record) not yet passed by a fetch."""
        self._last_sent = float("-inf")
        self._last_traffic = clock()
        self._caught_up = False
        self._rings = 0
        self._rung = asyncio.Event()
        self._waits: set[asyncio.Future[None]] = set()

    @property
    def rings(self) -> int:
        """Rings heard so far: pass it to :meth:`rest` taken *before* looking for records."""
        return self._rings

    def fetched(self, *, records: bool) -> None:
        """A fetch returned (``records``: whether it brought any). Either way it may have
        caught up: looking at the end offsets costs less than another fetch."""
        if records:
            self._last_traffic = self._clock()
            self._look_every_s = self.interval_s
            self.fetchable()
        self._caught_up = True

    def fetchable(self) -> None:
        """Partitions the last fetch left out can be fetched again (their records were
        taken, or they were resumed): a wait between fetches ends. A ring heard while
        they were left out was spent on a fetch that could not find its record."""
        self._end_waits()

    def awake(self) -> None:
        """Too busy to fetch: that is not caught up."""
        self._last_traffic = self._clock()
        self._caught_up = False

    def keep_fast(self, seconds: float) -> None:
        """Fetch every ``fetch_max_wait_ms`` for ``seconds`` from now, at least (whatever
        the marks say: the rings of that spell may not have reached it)."""
        self._fast_until = max(self._fast_until, self._clock() + seconds)

    @property
    def critical(self) -> bool:
        """On the critical path (no wake delay): it listens to fast rings."""
        return self.wake_delay_s <= 0 and self.fast_window_s > 0

    @property
    def exact(self) -> bool:
        """It fetches only when owed a record (:meth:`owed`): the fast rings of every topic
        it reads reach it, and the spell after their confirmation has passed."""
        return self.rung_awake and self._clock() >= self._fast_until

    def owed(
        self,
        offsets: Mapping[TopicPartition, int],
        assigned: Collection[TopicPartition],
        ends: Mapping[TopicPartition, int | None] | None = None,
    ) -> bool:
        """Whether a fetch from ``offsets`` (partition -> offset it fetches from) is owed a
        record: one a ring named, or one before a partition's end as the last fetch
        reported it (``ends``: its high watermark, None before any fetch), so a backlog
        nobody rang (records published before this consumer was assigned them) is read
        without waiting for rings. Settles the marks it passed and those of partitions
        no longer ``assigned``; a partition the fetch leaves out (records buffered,
        paused) keeps its mark until a fetch names it."""
        owed = ends is not None and (
            any(ends.get(tp) is None for tp in offsets) or behind_reported_end(offsets, ends)
        )
        for tp, mark in list(self._marks.items()):
            start = offsets.get(tp)
            if start is None:
                if tp not in assigned:
                    del self._marks[tp]
            elif mark < start:
                del self._marks[tp]
            else:
                owed = True
        return owed

    def spacing(self, seconds: float) -> float:
        """An observer's fetch is sent at least ``seconds`` after its last one: how long
        to wait before this one (it is then counted as sent)."""
        now = self._clock()
        wait = max(0.0, self._last_sent + seconds - now)
        self._last_sent = now + wait
        return wait

    def should_rest(self) -> bool:
        return self._caught_up and self._clock() - self._last_traffic >= self.idle_after_s

    def ring(self, topic: str | None = None, marks: Marks | None = None) -> None:
        """A topic this consumer reads rang (``marks``: where its records are, from a
        fast ring): a rest under way (or about to begin) ends, and so does a wait between
        fetches (:meth:`between_fetches`, :meth:`hold`). A fast ring that does not say
        where (a send whose offset was not known) makes it fetch for a fast window."""
        if topic in self.quiet_topics:
            return
        if topic is not None and marks is not None:
            if not marks:
                self.keep_fast(self.fast_window_s)
            for partition, offset in marks.items():
                tp = TopicPartition(topic, partition)
                if offset > self._marks.get(tp, -1):
                    self._marks[tp] = offset
        self._rings += 1
        self._rung.set()
        self._end_waits()

    def _end_waits(self) -> None:
        for waiting in self._waits:
            if not waiting.done():
                waiting.set_result(None)
        self._waits.clear()

    async def between_fetches(self, seconds: float, *, since: int) -> None:
        """Wait ``seconds`` before the next fetch, unless a ring after ``since`` (taken
        before the fetch that came back empty was sent) or records seen waiting end it."""
        await self._wait(seconds, since=since)

    async def hold(self, *, since: int) -> bool:
        """Hold a fetch that is owed nothing: True once a ring after ``since`` or
        partitions freed end the hold (build the request again), False after
        ``interval_s`` (send it: a ring may have been lost)."""
        return await self._wait(self.interval_s, since=since)

    async def _wait(self, seconds: float, *, since: int) -> bool:
        if self._rings != since:
            return True
        if seconds <= 0:
            return False
        waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waits.add(waiting)
        try:
            await asyncio.wait([waiting], timeout=seconds)
        finally:
            self._waits.discard(waiting)
        return waiting.done()

    async def rest(self, stopped: asyncio.Future[Any], *, since: int) -> bool:
        """Rest until a ring after ``since`` (True), one look's spacing, or ``stopped``
        (False). A rest that ends unrung doubles the spacing of the next (up to
        ``look_max_s``).

        After a ring, waits ``wake_delay_s`` more (unless stopped) before returning."""
        if self._rings == since:
            self._rung.clear()
            rung = asyncio.ensure_future(self._rung.wait())
            try:
                await asyncio.wait(
                    [rung, stopped],
                    timeout=self._look_every_s,
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                rung.cancel()
        woken = self._rings != since
        if woken:
            await self.records_wait(stopped)
        else:
            self._look_every_s = min(self._look_every_s * 2, self.look_max_s)
        return woken

    async def records_wait(self, stopped: asyncio.Future[Any]) -> None:
        """Records wait on the broker (rung, or seen in the end offsets): awake, after
        ``wake_delay_s`` (unless stopped)."""
        self._look_every_s = self.interval_s
        self.awake()
        self._end_waits()
        if self.wake_delay_s > 0 and not stopped.done():
            await asyncio.wait([stopped], timeout=self.wake_delay_s)

    async def rest_unless_unread(
        self, consumer: AIOKafkaConsumer, stopped: asyncio.Future[Any]
    ) -> bool:
        """Caught up, with the consumer's partitions paused by the caller: unless the end
        offsets show records, rest until a ring or one interval. True when records may
        wait (fetch again), False when the interval passed or ``stopped``."""
        since = self.rings  # before the look: a record acknowledged after it rings
        if await unread(consumer):
            await self.records_wait(stopped)
            return True
        return await self.rest(stopped, since=since)


class TrafficSignal:
    """One process's end of the fleet's doorbell: rings topics, wakes its consumers.

    :meth:`announce` wakes this process's consumers of the topic at once and rings it on
    Redis in the background (a send never waits for Redis): on the fleet's channel, and
    on the topic's fast channel (:func:`fast_channel`); topics rung while a ring is under
    way go together in the next pipeline. :meth:`listen` (a worker's background job)
    wakes the registered :class:`FetchPace` of each topic rung by anyone, and subscribes
    to the fast channels of the topics its critical consumers read.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        channel: str,
        every_s: float = 0.0,
        fast_every_s: float = FAST_RING_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``every_s``: ring a topic on the fleet's channel at most this often (half the
        consumers' idle spell; 0: on every acknowledged send). ``fast_every_s``: the
        same on its fast channel."""
        self._redis = redis
        self._channel = channel
        self._every_s = every_s
        self._fast_every_s = fast_every_s
        self._rung: dict[str, float] = {}
        self._fast_rung: dict[str, float] = {}
        self._clock = clock
        self._pending: set[str] = set()
        self._pending_fast: set[str] = set()
        self._marks: dict[str, dict[int, int]] = {}
        """Marks acknowledged since the topic's last fast ring."""
        self._trailing: asyncio.TimerHandle | None = None
        self._trailing_at = float("inf")
        self._heard: dict[str, str] = {}
        """Fast channel -> topic, of the critical consumers registered here."""
        self._confirmed: set[str] = set()
        """Fast channels whose subscription the server confirmed."""
        self._ringing: asyncio.Task[None] | None = None
        self._quiet_until = float("-inf")
        self._paces: dict[str, set[FetchPace]] = {}
        self.live = False
        """Whether :meth:`listen` is subscribed: only then may consumers rest (rings of
        other processes reach them). Until then, and while Redis is away, they poll."""

    def register(self, pace: FetchPace) -> None:
        for topic in pace.topics:
            self._paces.setdefault(topic, set()).add(pace)
            if pace.critical:
                self._heard[fast_channel(self._channel, topic)] = topic
        self._update_rung_awake(pace)

    def unregister(self, pace: FetchPace) -> None:
        for topic in pace.topics:
            self._paces.get(topic, set()).discard(pace)
        pace.rung_awake = False

    def _update_rung_awake(self, pace: FetchPace) -> None:
        pace.rung_awake = (
            pace.critical
            and self.live
            and all(fast_channel(self._channel, t) in self._confirmed for t in pace.topics)
        )

    def announce(self, topic: str, partition: int | None = None, offset: int | None = None) -> None:
        mark = {partition: offset} if partition is not None and offset is not None else {}
        self._wake_local(topic, mark)  # consumers of this process need no round trip
        now = self._clock()
        if now < self._quiet_until:
            return
        last = self._rung.get(topic)
        if self._every_s <= 0 or last is None or now - last >= self._every_s:
            # Otherwise its consumers are still awake from the last ring (see above).
            self._rung[topic] = now
            self._pending.add(topic)
        marks = self._marks.setdefault(topic, {})
        for p, o in mark.items():
            marks[p] = max(o, marks.get(p, -1))
        self._due(topic, now)
        if (self._pending or self._pending_fast) and self._ringing is None:
            self._ringing = asyncio.get_running_loop().create_task(self._ring())

    def _due(self, topic: str, now: float) -> None:
        """Ring ``topic``'s fast channel now if its spell allows, else at the spell's end
        (one timer for every topic waiting: marks acknowledged meanwhile go together)."""
        last_fast = self._fast_rung.get(topic)
        if last_fast is None or now - last_fast >= self._fast_every_s:
            self._fast_rung[topic] = now
            self._pending_fast.add(topic)
            return
        at = last_fast + self._fast_every_s
        if at < self._trailing_at:
            if self._trailing is not None:
                self._trailing.cancel()
            self._trailing_at = at
            self._trailing = asyncio.get_running_loop().call_later(at - now, self._ring_trailing)

    def _ring_trailing(self, *, now_or_never: bool = False) -> None:
        """Ring the marks whose spell is over (``now_or_never``: all of them, closing)."""
        self._trailing, self._trailing_at = None, float("inf")
        now = self._clock()
        if now < self._quiet_until:
            return
        for topic in [t for t, marks in self._marks.items() if marks]:
            if now_or_never:
                self._pending_fast.add(topic)
            else:
                self._due(topic, now)
        if self._pending_fast and self._ringing is None:
            self._ringing = asyncio.get_running_loop().create_task(self._ring())

    async def _ring(self) -> None:
        try:
            while self._pending or self._pending_fast:
                topics, self._pending = sorted(self._pending), set()
                fast, self._pending_fast = sorted(self._pending_fast), set()
                marks = {topic: self._marks.pop(topic, {}) for topic in fast}
                try:
                    async with self._redis.pipeline(transaction=False) as pipe:
                        for topic in topics:
                            pipe.publish(self._channel, topic)
                        for topic in fast:
                            pipe.publish(
                                fast_channel(self._channel, topic), fast_ring(topic, marks[topic])
                            )
                        heard = await pipe.execute()
                except (RedisError, OSError) as exc:
                    # Only latency is lost: resting consumers look for records every
                    # interval. Quiet for a while, so a Redis that is down is not asked
                    # again by every send.
                    self._quiet_until = self._clock() + _QUIET_AFTER_FAILURE_S
                    self._pending.clear()
                    self._pending_fast.clear()
                    self._marks.clear()
                    log.debug("ring not sent", extra={"error": type(exc).__name__})
                    continue
                for topic, listeners in zip(fast, heard[len(topics) :], strict=True):
                    if not listeners:  # only observers read it: leave it alone a while
                        self._fast_rung[topic] = (
                            self._clock() + _UNHEARD_QUIET_S - self._fast_every_s
                        )
        finally:
            self._ringing = None

    def _wake_local(self, topic: str, marks: Marks | None = None) -> None:
        for pace in self._paces.get(topic, ()):
            pace.ring(topic, marks)

    async def close(self) -> None:
        """Ring what waits for the end of a spell, and wait for a ring under way (bounded:
        it is one pipeline of ``PUBLISH``)."""
        if self._trailing is not None:
            self._trailing.cancel()
            self._ring_trailing(now_or_never=True)
        ringing = self._ringing
        if ringing is not None:
            await asyncio.wait([ringing], timeout=1.0)
            ringing.cancel()

    async def listen(
        self,
        stop: asyncio.Event,
        *,
        subscribed: Callable[[], None] | None = None,
        max_backoff_s: float = 5.0,
    ) -> None:
        """Wake the registered paces of every topic rung until ``stop``; reconnects.

        Each time the subscription is (re)confirmed every registered pace is rung: rings
        sent while nobody listened were missed, so each consumer looks for itself."""

        async def wake(message: str) -> None:
            self._wake_local(*parse_ring(message))

        def confirmed() -> None:
            self.live = True
            for paces in self._paces.values():
                for pace in paces:
                    pace.ring()
            self._update_all()
            if subscribed is not None:
                subscribed()

        await listen_with_reconnect(
            self._redis,
            self._channel,
            wake,
            stop,
            after_subscribe=confirmed,
            after_connection_lost=self._lost,
            max_backoff_s=max_backoff_s,
            more_channels=lambda: self._heard,
            after_channel_subscribe=self._fast_confirmed,
        )

    def _fast_confirmed(self, channel: str) -> None:
        self._confirmed.add(channel)
        topic = self._heard.get(channel)
        if topic is not None:
            # A producer whose ring found nobody a moment ago may not ring the channel
            # again for a while: until then, its consumers fetch as if just rung.
            for pace in self._paces.get(topic, ()):
                pace.keep_fast(_UNHEARD_QUIET_S + pace.fast_window_s)
            self._wake_local(topic)  # rings sent before it listened were missed
        self._update_all()

    def _update_all(self) -> None:
        for paces in self._paces.values():
            for pace in paces:
                self._update_rung_awake(pace)

    def _lost(self) -> None:
        self.live = False
        self._confirmed.clear()
        self._update_all()


async def unread(consumer: AIOKafkaConsumer, *, timeout_s: float = 2.0) -> bool:
    """Whether any assigned partition has records past the consumer's position (read
    from the brokers' end offsets, no fetch). When in doubt (no answer, no position
    yet), True: the consumer then fetches as usual."""

    async def look() -> bool:
        parts = list(consumer.assignment())
        if not parts:
            return False
        ends = await consumer.end_offsets(parts)
        for tp in parts:
            if ends.get(tp, 0) > await consumer.position(tp):
                return True
        return False

    try:
        return await asyncio.wait_for(look(), timeout_s)
    except (TimeoutError, KafkaError, AssertionError):  # AssertionError: unassigned now
        return True
