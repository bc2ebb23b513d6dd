"""toolfleet's consumer runtime on aiokafka: concurrent handling, exact commits.

:class:`EventConsumer` owns the aiokafka consumer: its group membership, polling,
pacing, backpressure, commits and rebalances. How fetched records reach the handler is
its mode's (:mod:`toolfleet.bus.consumer`), picked once from the handler and the spec:

- :class:`~toolfleet.bus.consumer.per_record.PerRecord`: each record becomes a task (up
  to ``max_in_flight`` at once; at that bound the loop waits for a record to finish,
  and past :data:`~toolfleet.bus.consumer.spec.FULL_POLL_S` of waiting pauses the
  assigned partitions and calls ``getmany`` anyway, so long tools never trip
  ``max.poll.interval.ms``);
- :class:`~toolfleet.bus.consumer.per_record.Scheduled` (a ``schedule``: the executor)
  reads ahead: records are decoded into a :class:`~toolfleet.bus.scheduler.Backlog` and
  started by priority, fairly across tenants, within a per-tenant bound; a queued record
  is unfinished for commits like a running one;
- :class:`~toolfleet.bus.consumer.batch.Batched` (a :class:`ByBatch` handler: audit,
  status) handles the records of a fetch together.

A record's outputs are published and acknowledged before it counts as finished, and a
partition is committed only up to its lowest unfinished offset
(:mod:`toolfleet.bus.offsets`): at-least-once, with dedupe by ``source``+``id`` making
redeliveries harmless. Undecodable or invalid input goes to the DLQ and the consumer
keeps going. Transient infrastructure errors are retried with full-jitter backoff for as
long as it takes; anything else is retried a few times, then dead-lettered with the
original bytes (:class:`~toolfleet.bus.consumer.core.ConsumerCore`).

How a consumer waits for records and how it leaves its group are its broker profile's
(:mod:`toolfleet.bus.profile`): long polls and LeaveGroup by default, another
profile when the process was given it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, KafkaError

from toolfleet.bus.consumer.batch import Batched
from toolfleet.bus.consumer.core import ConsumerCore, Mode
from toolfleet.bus.consumer.per_record import PerRecord, Scheduled
from toolfleet.bus.consumer.spec import (
    FULL_POLL_S,
    PATTERN_METADATA_MAX_AGE_MS,
    BatchHandler,
    ByBatch,
    ConsumerSpec,
    Handler,
    Inbound,
    consumer_kwargs,
    pacing_input,
)
from toolfleet.bus.dedupe import ProcessedEvents
from toolfleet.bus.offsets import Partition
from toolfleet.bus.producer import EventProducer
from toolfleet.bus.profile import BrokerProfile, FetchPacing, built_in_profile
from toolfleet.observability import metrics
from toolfleet.settings import FleetSettings

__all__ = [
    "PATTERN_METADATA_MAX_AGE_MS",
    "BatchHandler",
    "ByBatch",
    "ConsumerSpec",
    "EventConsumer",
    "Handler",
    "Inbound",
    "consumer_kwargs",
    "pacing_input",
]

log = logging.getLogger(__name__)


class EventConsumer:
    """Consumes ``spec.topics`` in ``spec.group_id`` and runs ``handler`` per event (a
    :class:`ByBatch` handler: per fetch)."""

    def __init__(
        self,
        spec: ConsumerSpec,
        handler: Handler | ByBatch,
        *,
        settings: FleetSettings,
        producer: EventProducer,
        processed: ProcessedEvents | None,
        dlq_topic: str,
        profile: BrokerProfile | None = None,
    ) -> None:
        """``profile``: the process's broker profile (:mod:`toolfleet.bus.profile`), which
        paces its fetches and closes it; None: the ``kafka`` profile, which the settings
        must then name."""
        self.spec = spec
        self._handler = handler
        self._settings = settings
        self._core = ConsumerCore(
            spec, settings=settings, producer=producer, processed=processed, dlq_topic=dlq_topic
        )
        self._mode = _mode_of(spec, handler, self._core)
        self._consumer: AIOKafkaConsumer | None = None
        self._paused = False
        self.full_poll_s = FULL_POLL_S
        """How long it waits at its in-flight bound before a poll that keeps it in its group."""
        self._profile = profile
        self._pacing: FetchPacing | None = None
        self.assigned = asyncio.Event()
        """Set once the consumer has been assigned partitions (tests)."""
        self.joined = asyncio.Event()
        """Set once the consumer has joined its group, with or without partitions (a member
        beyond the partition count gets none and is still in its group): readiness."""
        # The in-flight gauge is read when scraped, not set twice per record.
        alive = weakref.ref(self._core)
        metrics.IN_FLIGHT.labels(spec.service).set_function(
            lambda: float(core.in_flight) if (core := alive()) is not None else 0.0
        )

    @property
    def handler(self) -> Handler | ByBatch:
        return self._handler

    @property
    def deduplicates(self) -> bool:
        """Whether it skips records its group marked processed (Redis markers)."""
        return self._core.processed is not None

    @property
    def queued(self) -> int:
        """Records fetched and waiting in the backlog (scheduling consumers only)."""
        return self._mode.queued

    # --- lifecycle -----------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set, then drain in-flight work and commit."""
        profile = self._profile or built_in_profile(self._settings)
        self._profile = profile
        pacing = profile.pacing(pacing_input(self.spec))
        consumer = AIOKafkaConsumer(**consumer_kwargs(self._settings, self.spec, pacing))
        self._consumer = consumer
        self._core.stop_requested = stop
        if self.spec.pattern is not None:
            consumer.subscribe(pattern=self.spec.pattern, listener=_Rebalance(self))
        else:
            consumer.subscribe(list(self.spec.topics), listener=_Rebalance(self))
        if not await self._start_unless_stopped(consumer, stop):
            self._consumer = None
            return
        pacing.after_start(consumer)
        self._pacing = pacing
        committer = asyncio.create_task(self._commit_loop(), name=f"{self.spec.service}-commit")
        try:
            await self._poll_loop(consumer, stop, pacing)
        finally:
            pacing.close()
            self._pacing = None
            self._core.stopping.set()
            await self._core.drain(self._settings.drain_timeout_s)
            # A commit or a leave during a rebalance waits for the group join under way,
            # which a fleet in the middle of a rebalance can stretch out. Past the session
            # timeout the group drops this member anyway, and whatever was not committed
            # is redelivered: bounded, so SIGTERM always ends the process.
            try:
                await asyncio.wait_for(
                    self._leave(consumer, committer),
                    timeout=self._settings.session_timeout_ms / 1000,
                )
            except TimeoutError:
                log.warning("left the consumer group without waiting for its rebalance")
            self._consumer = None

    async def _start_unless_stopped(self, consumer: AIOKafkaConsumer, stop: asyncio.Event) -> bool:
        """Start ``consumer``; False if ``stop`` came first (it is then closed).

        A subscribed consumer's ``start`` returns only once the group has assigned it
        partitions: a whole group join, which a fleet in the middle of a rebalance (other
        members draining, or gone without leaving) can stretch to the rebalance timeout.
        A worker told to stop meanwhile has fetched nothing and owes no commit, so it
        stops at once rather than join a group only to leave it.
        """
        starting = asyncio.ensure_future(consumer.start())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([starting, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if starting.done():
            starting.result()  # a failed start raises here
            return True
        starting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        log.info(
            "stopped before the consumer group assigned any partition",
            extra={"group": self.spec.group_id},
        )
        with contextlib.suppress(TimeoutError, KafkaError, OSError):
            await asyncio.wait_for(
                self._stop_consumer(consumer), timeout=self._settings.session_timeout_ms / 1000
            )
        return False

    async def _stop_consumer(self, consumer: AIOKafkaConsumer) -> None:
        """Close ``consumer`` as its profile does (``kafka``: LeaveGroup, so its partitions
        move at once)."""
        profile = self._profile or built_in_profile(self._settings)
        await profile.stop_consumer(consumer)

    async def _leave(self, consumer: AIOKafkaConsumer, committer: asyncio.Task[None]) -> None:
        committer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await committer
        await self._commit(final=True)
        await self._stop_consumer(consumer)

    async def _poll_loop(
        self, consumer: AIOKafkaConsumer, stop: asyncio.Event, pacing: FetchPacing
    ) -> None:
        stopped = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                free = self._mode.room()
                if free <= 0 and await self._room_made(stopped):
                    continue
                if stop.is_set():
                    return
                timeout_ms, still_idle = pacing.poll_timeout_ms, False
                if pacing.wants_rest(busy=free <= 0):
                    still_idle = await self._rest(consumer, pacing, stopped)
                    if stop.is_set():
                        return
                    if still_idle:
                        timeout_ms = 0  # paused: this poll only keeps the membership
                self._apply_backpressure(consumer, full=free <= 0 or still_idle)
                fetch = asyncio.ensure_future(
                    consumer.getmany(timeout_ms=timeout_ms, max_records=max(free, 1))
                )
                # A fetch can block for a whole group join; a stop must not wait for it.
                await asyncio.wait([fetch, stopped], return_when=asyncio.FIRST_COMPLETED)
                if not fetch.done():
                    fetch.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await fetch
                    return
                batch = fetch.result()
                if not still_idle and free > 0:
                    pacing.after_fetch(records=bool(batch))
                self._dispatch_batch(consumer, batch)
        finally:
            stopped.cancel()

    async def _room_made(self, stopped: asyncio.Future[Any]) -> bool:
        """At the in-flight bound: wait until a record finishes (True), or for
        :attr:`full_poll_s` (False: the caller pauses its partitions and polls, which
        keeps it in its group past ``max.poll.interval.ms`` while long tools hold every
        slot).

        The partitions are not paused for the wait. A paused partition's records that
        aiokafka fetched already (one fetch result a partition) are dropped at the next
        ``getmany`` and fetched again once it resumes: at saturation, where a consumer
        reaches its bound many times a second, every fetch was paid for twice, and each
        dropped fetch (an unfinished generator over its bytes, a reference cycle) waited
        for the cyclic collector: an observer that fell behind grew to hundreds of MB."""
        room = self._core.room_freed
        room.clear()
        if self._mode.room() > 0:
            return True
        freed = asyncio.ensure_future(room.wait())
        try:
            await asyncio.wait(
                [freed, stopped], timeout=self.full_poll_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            freed.cancel()
        return self._mode.room() > 0

    async def _rest(
        self, consumer: AIOKafkaConsumer, pacing: FetchPacing, stopped: asyncio.Future[Any]
    ) -> bool:
        """Caught up: pause and rest (:meth:`FetchPacing.rest`). True when still idle
        (partitions stay paused), False to fetch."""
        self._apply_backpressure(consumer, full=True)
        resting = metrics.CONSUMERS_RESTING.labels(self.spec.service)
        resting.inc()
        try:
            return not await pacing.rest(consumer, stopped)
        finally:
            resting.dec()

    def _dispatch_batch(
        self,
        consumer: AIOKafkaConsumer,
        batch: dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]],
    ) -> None:
        if consumer.assignment():
            self.assigned.set()
        self._mode.dispatch([record for records in batch.values() for record in records])

    def _apply_backpressure(self, consumer: AIOKafkaConsumer, *, full: bool) -> None:
        # Re-applied every round: a rebalance may have assigned new partitions since.
        if full:
            consumer.pause(*consumer.assignment())
            self._paused = True
        elif self._paused:
            consumer.resume(*consumer.assignment())
            self._paused = False
            if self._pacing is not None:
                self._pacing.after_resume()

    # --- commits and rebalances ------------------------------------------------------

    async def _commit_loop(self) -> None:
        """Commit at most every ``commit_interval_s``, and only after a record finished:
        an idle consumer's committer sleeps instead of waking five times a second to
        find nothing to commit (bench/HISTORY.md, eighteenth pass)."""
        finished = self._core.finished
        while True:
            await finished.wait()
            finished.clear()
            await asyncio.sleep(self.spec.commit_interval_s)
            await self._commit()

    async def _commit(
        self, parts: Sequence[Partition] | None = None, *, final: bool = False
    ) -> None:
        consumer = self._consumer
        if consumer is None:
            return
        owned = {Partition(tp.topic, tp.partition) for tp in consumer.assignment()}
        wanted = owned if parts is None else owned & set(parts)
        offsets = self._core.tracker.committable(wanted)
        if not offsets:
            return
        try:
            await consumer.commit(
                {TopicPartition(p.topic, p.partition): off for p, off in offsets.items()}
            )
            self._core.tracker.mark_committed(offsets)
        except (CommitFailedError, KafkaError) as exc:
            # A rebalance is under way; the next owner re-reads from the last commit.
            level = logging.INFO if final else logging.WARNING
            log.log(level, "commit failed", extra={"error": type(exc).__name__})

    async def release(self, revoked: Sequence[Partition]) -> None:
        """Called on revoke: let in-flight work of those partitions finish, then commit."""
        revoked_set = set(revoked)
        self._mode.before_release(revoked_set)
        mine = self._core.tasks_of(revoked_set)
        if mine:
            if self.spec.on_revoke is not None:
                self.spec.on_revoke(list(revoked_set))
            _, pending = await asyncio.wait(mine, timeout=self.spec.revoke_grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await self._commit(list(revoked_set))
        self._core.tracker.forget(revoked_set)


def _mode_of(spec: ConsumerSpec, handler: Handler | ByBatch, core: ConsumerCore) -> Mode:
    """How records of ``spec`` reach ``handler``: the one place the modes are told apart."""
    if isinstance(handler, ByBatch):
        if spec.schedule is not None:
            raise ValueError("a scheduling consumer handles records one by one")
        return Batched(core, handler.handle)
    if spec.schedule is not None:
        return Scheduled(core, handler, spec.schedule)
    return PerRecord(core, handler)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, runtime: EventConsumer) -> None:
        self._runtime = runtime

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._runtime.release([Partition(tp.topic, tp.partition) for tp in revoked])

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info(
            "partitions assigned",
            extra={"group": self._runtime.spec.group_id, "partitions": len(assigned)},
        )
        self._runtime.joined.set()
        if assigned:
            self._runtime.assigned.set()
        on_assign = self._runtime.spec.on_assign
        if on_assign is not None:
            on_assign([Partition(tp.topic, tp.partition) for tp in assigned])
