"""Broker profiles: what the runtime does differently on one kind of broker.

``TOOLFLEET_BROKER_PROFILE`` names one. ``kafka`` (the default, :class:`KafkaProfile`)
is for Apache Kafka, MSK, Confluent and Redpanda: a fetch long-polls at the broker
(``fetch.max.wait.ms``, 500 ms unless set), which answers the moment a record lands;
the producer is idempotent with ``acks=all``; a stopping consumer leaves its group
(LeaveGroup), so its partitions move at once. It uses aiokafka's public API only
(``getmany(timeout_ms)``, ``pause``/``resume``, ``commit``, ``stop``).

``dev`` is the embedded broker's (``toolfleet dev``, the tests). Its implementation
lives in the dev stack (:mod:`toolfleet.devstack.broker_profile`, the only product code
touching private parts of aiokafka) and reaches the fleet as a plugin: the package
registers it under the ``toolfleet.broker_profiles`` entry points, and
:func:`open_profile` loads it only when named. The bus never imports the dev stack;
the runtime sees only the ports below.

A consumer's poll loop calls its :class:`FetchPacing`; a producer tells the profile's
:class:`TrafficAnnouncer` (if any) of every acknowledged send; the worker runs the
profile's background jobs and closes it last.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, cast

from toolfleet.settings import FleetSettings

if TYPE_CHECKING:  # annotations only: importable without the fleet extra
    from aiokafka import AIOKafkaConsumer
    from redis.asyncio import Redis

PROFILE_ENTRY_POINTS = "toolfleet.broker_profiles"
"""The entry-point group a broker profile other than ``kafka`` is registered under."""

Job = Callable[[asyncio.Event], Coroutine[Any, Any, None]]
"""A background job: runs until the event is set."""


class TrafficAnnouncer(Protocol):
    """What a producer tells once a send was acknowledged (the dev profile's doorbell)."""

    def announce(self, topic: str, partition: int | None = None, offset: int | None = None) -> None:
        """A record is now on ``topic`` (at ``offset`` of ``partition``, when known);
        never blocks, never raises."""
        ...


@dataclass(frozen=True, kw_only=True)
class PacingInput:
    """What a consumer tells its profile when it asks for its :class:`FetchPacing`."""

    topics: frozenset[str]
    """The topics it reads."""
    fetch_max_wait_ms: int | None = None
    """Its own fetch wait (ms); None: the fleet's ``fetch_max_wait_ms``."""
    observer: bool = False
    """Off the outcome's critical path (audit, status): a profile may fetch for it less
    eagerly, collecting several hops per fetch."""
    poll_timeout_ms: int = 100
    """How long one ``getmany`` waits, unless the profile needs another: how soon the
    loop sees a stop or a freed slot while nothing arrives."""


class FetchPacing(Protocol):
    """How one consumer waits for records: the hooks its poll loop calls.

    The loop, each round: ``wants_rest`` (told whether it is too busy to fetch); if so,
    it pauses its partitions and awaits ``rest``; then ``getmany(poll_timeout_ms)`` and
    ``after_fetch``. ``after_resume`` follows every ``resume`` of its partitions.
    """

    @property
    def broker_wait_ms(self) -> int:
        """``fetch_max_wait_ms`` of its fetch requests: how long the broker may hold one."""
        ...

    @property
    def poll_timeout_ms(self) -> int:
        """How long one ``getmany`` waits for records before the loop goes round."""
        ...

    def after_start(self, consumer: AIOKafkaConsumer) -> None:
        """``consumer`` started (its fetcher runs)."""

    def wants_rest(self, *, busy: bool) -> bool:
        """Whether to pause and :meth:`rest` before the next fetch (never while ``busy``:
        too busy to fetch is not caught up)."""
        ...

    async def rest(self, consumer: AIOKafkaConsumer, stopped: asyncio.Future[Any]) -> bool:
        """Rest, partitions paused: True once records may wait (fetch again), False when
        still idle (the loop polls with its partitions paused, keeping its membership)."""
        ...

    def after_resume(self) -> None:
        """The consumer's partitions were resumed."""

    def after_fetch(self, *, records: bool) -> None:
        """A fetch returned (``records``: whether it brought any)."""

    def set_quiet(self, topics: frozenset[str]) -> None:
        """Records of ``topics`` are awaited by nobody for now: their arrival need not
        hurry a fetch (they come with the next one of the other topics)."""

    def close(self) -> None:
        """The consumer stopped."""


class BrokerProfile(Protocol):
    """What the fleet's clients do differently on one kind of broker."""

    @property
    def name(self) -> str:
        """``kafka`` or ``dev`` (``TOOLFLEET_BROKER_PROFILE``)."""
        ...

    @property
    def announcer(self) -> TrafficAnnouncer | None:
        """Told of every acknowledged send of the process's producers; None: nobody."""
        ...

    def summary(self) -> str:
        """One line for the start of a process: the profile and what it does."""
        ...

    def pacing(self, request: PacingInput) -> FetchPacing:
        """The pacing of one consumer."""
        ...

    async def stop_consumer(self, consumer: AIOKafkaConsumer) -> None:
        """Close a consumer of a group (its commits are done)."""

    def background(self) -> Sequence[Job]:
        """Jobs the process runs beside its consumers while it lives."""
        ...

    async def aclose(self) -> None:
        """Release what the profile holds (after every consumer and producer stopped)."""


@dataclass(frozen=True, kw_only=True)
class LongPolls:
    """:class:`FetchPacing` of a broker that long-polls: the broker holds each fetch until
    a record lands or ``broker_wait_ms`` passed, and the client never waits on its own."""

    broker_wait_ms: int
    poll_timeout_ms: int

    def after_start(self, consumer: AIOKafkaConsumer) -> None:
        return None

    def wants_rest(self, *, busy: bool) -> bool:
        return False

    async def rest(self, consumer: AIOKafkaConsumer, stopped: asyncio.Future[Any]) -> bool:
        return True

    def after_resume(self) -> None:
        return None

    def after_fetch(self, *, records: bool) -> None:
        return None

    def set_quiet(self, topics: frozenset[str]) -> None:
        return None

    def close(self) -> None:
        return None


class KafkaProfile:
    """The ``kafka`` profile: long polls, the idempotent producer, LeaveGroup on stop."""

    def __init__(self, settings: FleetSettings) -> None:
        self._settings = settings

    @property
    def name(self) -> str:
        return "kafka"

    @property
    def announcer(self) -> TrafficAnnouncer | None:
        return None

    def summary(self) -> str:
        settings = self._settings
        producer = (
            "idempotent producer acks=all"
            if settings.enable_idempotence
            else "producer acks=all, not idempotent (TOOLFLEET_ENABLE_IDEMPOTENCE=false)"
        )
        return (
            f"broker profile: kafka (long polls {settings.fetch_max_wait_ms} ms, "
            f"{producer}, LeaveGroup on stop)"
        )

    def pacing(self, request: PacingInput) -> FetchPacing:
        wait = request.fetch_max_wait_ms
        return LongPolls(
            broker_wait_ms=self._settings.fetch_max_wait_ms if wait is None else wait,
            poll_timeout_ms=request.poll_timeout_ms,
        )

    async def stop_consumer(self, consumer: AIOKafkaConsumer) -> None:
        await consumer.stop()  # sends LeaveGroup: the group rebalances at once

    def background(self) -> Sequence[Job]:
        return ()

    async def aclose(self) -> None:
        return None


class ProfileNotGiven(ValueError):
    """The settings name a profile whose implementation the caller did not pass."""


class ProfilePlugin(Protocol):
    """What a profile registered under :data:`PROFILE_ENTRY_POINTS` names."""

    def open(
        self, settings: FleetSettings, *, redis: Redis | None = None, doorbell: bool = True
    ) -> BrokerProfile:
        """The profile of one process (``redis``: a worker's own connection, for the
        profile's background jobs; ``doorbell=False``: a reader at its own pace)."""
        ...


def open_profile(
    settings: FleetSettings, *, redis: Redis | None = None, doorbell: bool = True
) -> BrokerProfile:
    """The profile ``TOOLFLEET_BROKER_PROFILE`` names, for a worker, a client or a tail
    (see :meth:`ProfilePlugin.open`); the caller closes it. ``kafka`` is built in; the
    others are loaded from their entry point when named, never before."""
    if settings.broker_profile == "kafka":
        return KafkaProfile(settings)
    return _plugin(settings.broker_profile).open(settings, redis=redis, doorbell=doorbell)


@cache
def _plugin(name: str) -> ProfilePlugin:
    found = entry_points(group=PROFILE_ENTRY_POINTS, name=name)
    if not found:
        raise ProfileNotGiven(
            f"TOOLFLEET_BROKER_PROFILE={name}: no such profile is installed "
            f"(entry points {PROFILE_ENTRY_POINTS}); install toolfleet itself "
            "(pip install -e .) rather than putting its sources on the path"
        )
    return cast(ProfilePlugin, next(iter(found)).load())


def built_in_profile(settings: FleetSettings) -> BrokerProfile:
    """The profile of a consumer nobody passed one to: ``kafka``'s. The ``dev``
    profile's implementation lives apart, so a consumer under it is given one."""
    if settings.broker_profile != "kafka":
        raise ProfileNotGiven(
            f"TOOLFLEET_BROKER_PROFILE={settings.broker_profile}: pass its implementation "
            "(open_profile(settings)) as profile="
        )
    return KafkaProfile(settings)
