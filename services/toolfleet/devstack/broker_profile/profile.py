"""The ``dev`` profile: :class:`~toolfleet.bus.profile.BrokerProfile` of the embedded broker."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer
from redis.asyncio import Redis

from toolfleet.bus.profile import FetchPacing, Job, PacingInput, TrafficAnnouncer
from toolfleet.devstack.broker_profile.client_wait import fetch_waits, wait_in_client
from toolfleet.devstack.broker_profile.doorbell import (
    FetchPace,
    TrafficSignal,
    fetch_pace,
    traffic_signal,
)
from toolfleet.devstack.broker_profile.leave_group import without_leave_group
from toolfleet.devstack.broker_profile.settings import DevBrokerSettings
from toolfleet.settings import FleetSettings
from toolfleet.storage.redis import connect_redis


class DoorbellPacing:
    """:class:`~toolfleet.bus.profile.FetchPacing` of the dev profile: the broker holds a
    fetch ``broker_wait_ms``, the client waits the rest itself (:func:`wait_in_client`),
    and with a ``pace`` the consumer rests once caught up until its topics ring."""

    def __init__(
        self,
        *,
        broker_wait_ms: int,
        client_wait_s: float,
        poll_timeout_ms: int,
        found_wait_ms: int = 0,
        pace: FetchPace | None = None,
        traffic: TrafficSignal | None = None,
    ) -> None:
        self.broker_wait_ms = broker_wait_ms
        self.client_wait_s = client_wait_s
        self.poll_timeout_ms = poll_timeout_ms
        self.found_wait_ms = found_wait_ms
        self.pace = pace
        self._traffic = traffic if pace is not None else None

    def after_start(self, consumer: AIOKafkaConsumer) -> None:
        wait_in_client(consumer, self.client_wait_s, self.pace, found_wait_ms=self.found_wait_ms)
        if self.pace is not None and self._traffic is not None:
            self._traffic.register(self.pace)

    def wants_rest(self, *, busy: bool) -> bool:
        pace = self.pace
        if pace is None:
            return False
        if busy:
            pace.awake()  # too busy to fetch is not caught up
            return False
        # Only while the rings of other processes reach it.
        return pace.should_rest() and self._traffic is not None and self._traffic.live

    async def rest(self, consumer: AIOKafkaConsumer, stopped: asyncio.Future[Any]) -> bool:
        if self.pace is None:
            return True
        return await self.pace.rest_unless_unread(consumer, stopped)

    def after_resume(self) -> None:
        if self.pace is not None:
            self.pace.fetchable()

    def after_fetch(self, *, records: bool) -> None:
        if self.pace is not None:
            self.pace.fetched(records=records)

    def set_quiet(self, topics: frozenset[str]) -> None:
        pace = self.pace
        if pace is None:
            return
        heard_again = pace.quiet_topics - topics
        pace.quiet_topics = topics
        for topic in heard_again:
            # Its rings were ignored until now: fetch for a while, as if rung.
            pace.ring(topic, {})

    def close(self) -> None:
        if self.pace is not None and self._traffic is not None:
            self._traffic.unregister(self.pace)


class DevBrokerProfile:
    """The ``dev`` profile (see :mod:`toolfleet.devstack.broker_profile`).

    Build it with :meth:`open`; ``traffic`` is the process's doorbell (None: off), and
    ``own_redis`` a connection it opened for it and closes in :meth:`aclose`.
    """

    def __init__(
        self,
        settings: FleetSettings,
        *,
        traffic: TrafficSignal | None = None,
        own_redis: Redis | None = None,
    ) -> None:
        self.settings = DevBrokerSettings.of(settings)
        self.traffic = traffic
        self._own_redis = own_redis

    @classmethod
    def open(
        cls, settings: FleetSettings, *, redis: Redis | None = None, doorbell: bool = True
    ) -> DevBrokerProfile:
        """The profile of a process. With ``doorbell`` (and ``TOOLFLEET_FETCH_DOORBELL``)
        it rings and hears on ``redis``, or on a connection of its own to
        ``TOOLFLEET_REDIS_URL`` (a client's: a Redis it cannot reach costs latency, never
        a record)."""
        dev = DevBrokerSettings.of(settings)
        if not doorbell or not dev.fetch_doorbell:
            return cls(dev)
        own = None
        if redis is None:
            own = redis = connect_redis(dev.redis_url, max_connections=2, wait_s=5.0)
        return cls(dev, traffic=traffic_signal(redis, dev), own_redis=own)

    @property
    def name(self) -> str:
        return "dev"

    @property
    def announcer(self) -> TrafficAnnouncer | None:
        return self.traffic

    def summary(self) -> str:
        at_broker, in_client_s = fetch_waits(
            self.settings.fetch_max_wait_ms, self.settings.fetch_broker_wait_ms
        )
        doorbell = "doorbell on Redis" if self.traffic is not None else "no doorbell"
        found_ms = self.settings.fetch_found_wait_ms
        found = (
            f"up to {found_ms} ms at the broker when known to find records, " if found_ms else ""
        )
        producer = "idempotent producer" if self.settings.enable_idempotence else "producer"
        return (
            f"broker profile: dev (fetches held {at_broker} ms at the broker, "
            f"{round(in_client_s * 1000)} ms more in the client, {found}{doorbell}, "
            f"{producer} acks=all, no LeaveGroup on stop)"
        )

    def pacing(self, request: PacingInput) -> FetchPacing:
        dev = self.settings
        wait = request.fetch_max_wait_ms
        if wait is None:
            wait = dev.observer_fetch_max_wait_ms if request.observer else dev.fetch_max_wait_ms
        at_broker, in_client_s = fetch_waits(wait, dev.fetch_broker_wait_ms)
        if self.traffic is None:
            return DoorbellPacing(
                broker_wait_ms=at_broker,
                client_wait_s=in_client_s,
                poll_timeout_ms=request.poll_timeout_ms,
                found_wait_ms=dev.fetch_found_wait_ms,
            )
        # Off the critical path: wait after a ring, so one fetch collects several hops.
        wake_delay_s = wait / 1000 if request.observer else 0.0
        return DoorbellPacing(
            broker_wait_ms=at_broker,
            client_wait_s=in_client_s,
            poll_timeout_ms=wait + 10,  # one whole fetch: an empty answer means caught up
            found_wait_ms=dev.fetch_found_wait_ms,
            pace=fetch_pace(dev, request.topics, wake_delay_s=wake_delay_s),
            traffic=self.traffic,
        )

    async def stop_consumer(self, consumer: AIOKafkaConsumer) -> None:
        without_leave_group(consumer)
        await consumer.stop()

    def background(self) -> Sequence[Job]:
        return (self.traffic.listen,) if self.traffic is not None else ()

    async def aclose(self) -> None:
        if self.traffic is not None:
            await self.traffic.close()
        if self._own_redis is not None:
            await self._own_redis.aclose()
