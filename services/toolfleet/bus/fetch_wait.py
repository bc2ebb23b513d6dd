"""Adaptive fetching: consumers rest while idle and are woken by the traffic that ends it.

A consumer fetches every ``fetch_max_wait_ms`` (5 ms by default) for low per-hop latency.
Real Kafka long-polls, so that costs little; the dev broker does not wake a waiting
fetch promptly, so an idle fleet polling every 5 ms keeps most of a core busy. So:

- a consumer that has fetched nothing for ``TOOLFLEET_IDLE_AFTER_MS`` **rests**: its
  partitions are paused (no fetch requests at all) and once every
  ``TOOLFLEET_IDLE_FETCH_INTERVAL_MS`` it compares the partitions' end offsets with its
  positions (one ``ListOffsets`` request, no fetch): records past them wake it;
- every producer of the fleet (workers and ``ToolfleetClient``) **announces traffic** on
  a Redis pub/sub channel when it sends to a topic it has not announced for half of
  ``TOOLFLEET_IDLE_AFTER_MS``; each worker's :class:`TrafficSignal` listener then wakes
  all its resting consumers at once, so the first call after an idle period finds every
  hop of the pipeline fetching again by the time its record gets there.

An announcement is only a hint: one lost (Redis down, a producer that does not announce,
such as a foreign Kafka client) costs at most one fetch interval of latency, never a
record. Nothing about offsets, commits or redelivery changes.

The rule that makes the hint sufficient: a producer announces a topic again once
``idle_after / 2`` has passed since its last announcement for it, and a consumer rests
only after ``idle_after`` without records. A record sent without an announcement thus
follows, by less than ``idle_after / 2``, a record the consumer fetched while awake, so
it is still awake (and fetching every few milliseconds) when that record arrives.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from toolfleet.settings import FleetSettings
from toolfleet.storage.pubsub import listen_with_reconnect

log = logging.getLogger(__name__)


def traffic_channel(topic_prefix: str) -> str:
    """The pub/sub channel of a fleet's traffic announcements."""
    return f"toolfleet:traffic:{topic_prefix}"


def traffic_signal(redis: Redis, settings: FleetSettings) -> TrafficSignal | None:
    """The fleet's :class:`TrafficSignal` over ``redis``; None when resting is off."""
    if settings.idle_after_ms <= 0:
        return None
    return TrafficSignal(
        redis,
        channel=traffic_channel(settings.topic_prefix),
        idle_after_s=settings.idle_after_ms / 1000,
    )


class FetchPace:
    """Whether one consumer fetches or rests, from when it last saw traffic.

    Args:
        idle_after_s: rest once nothing was fetched for this long.
        interval_s: while resting, look for records this often.
        clock: monotonic seconds (tests pass a fake one).
    """

    def __init__(
        self,
        *,
        idle_after_s: float,
        interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_after_s = idle_after_s
        self.interval_s = interval_s
        self._clock = clock
        self._last_traffic = clock()
        self._woken = asyncio.Event()

    def saw_traffic(self) -> None:
        """Records were fetched, or the consumer is too busy to fetch: stay awake."""
        self._last_traffic = self._clock()

    def should_rest(self) -> bool:
        return self._clock() - self._last_traffic >= self.idle_after_s

    def wake(self) -> None:
        """Traffic was announced: fetch at full pace again (for ``idle_after_s`` at least)."""
        self._last_traffic = self._clock()
        self._woken.set()

    async def rest(self, stopped: asyncio.Future[Any]) -> None:
        """Return after one interval, on :meth:`wake`, or once ``stopped`` is done."""
        self._woken.clear()
        woken = asyncio.ensure_future(self._woken.wait())
        try:
            await asyncio.wait(
                [woken, stopped], timeout=self.interval_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            woken.cancel()


class TrafficAnnouncer(Protocol):
    """What a producer tells when it sends: :class:`TrafficSignal` implements it."""

    def announce(self, topic: str) -> None:
        """``topic`` is about to get a record (never blocks, never raises)."""
        ...


class TrafficSignal:
    """One process's end of the traffic channel: announces sends, wakes its consumers.

    :meth:`announce` publishes in the background (a send never waits for Redis), at most
    once per topic every ``idle_after_s / 2``; :meth:`listen` (a worker's background job)
    wakes every registered :class:`FetchPace` on each announcement from anyone.
    """

    def __init__(
        self,
        redis: Redis,
        *,
        channel: str,
        idle_after_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = redis
        self._channel = channel
        self._every_s = idle_after_s / 2
        self._clock = clock
        self._announced: dict[str, float] = {}
        self._publishing: set[asyncio.Task[None]] = set()
        self._paces: set[FetchPace] = set()

    def register(self, pace: FetchPace) -> None:
        self._paces.add(pace)

    def unregister(self, pace: FetchPace) -> None:
        self._paces.discard(pace)

    def announce(self, topic: str) -> None:
        now = self._clock()
        last = self._announced.get(topic)
        if last is not None and now - last < self._every_s:
            return
        self._announced[topic] = now
        self._wake_local()  # consumers of this process need no round trip
        task = asyncio.get_running_loop().create_task(self._publish(topic))
        self._publishing.add(task)
        task.add_done_callback(self._publishing.discard)

    async def _publish(self, topic: str) -> None:
        try:
            await self._redis.publish(self._channel, topic)
        except (RedisError, OSError) as exc:
            # Only latency is lost: resting consumers look for records every interval. Not
            # retried before the next half spell: a client without a reachable Redis (a
            # remote CLI) pays one failed attempt per topic per half spell, no more.
            log.debug("traffic announcement not sent", extra={"error": type(exc).__name__})

    def _wake_local(self) -> None:
        for pace in self._paces:
            pace.wake()

    async def close(self) -> None:
        """Wait for announcements under way (bounded: they are single PUBLISH calls)."""
        if self._publishing:
            await asyncio.wait(list(self._publishing), timeout=1.0)
        for task in list(self._publishing):
            task.cancel()

    async def listen(
        self,
        stop: asyncio.Event,
        *,
        subscribed: Callable[[], None] | None = None,
        max_backoff_s: float = 5.0,
    ) -> None:
        """Wake the registered paces on every announcement until ``stop``; reconnects."""

        async def wake(_: str) -> None:
            self._wake_local()

        await listen_with_reconnect(
            self._redis,
            self._channel,
            wake,
            stop,
            after_subscribe=subscribed,
            max_backoff_s=max_backoff_s,
        )
