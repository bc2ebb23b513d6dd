"""toolfleet's consumer runtime on aiokafka: concurrent handling, exact commits.

Each record becomes a task (up to ``max_in_flight`` at once; past that the assigned
partitions are paused while ``getmany`` keeps being called, so long tools never trip
``max.poll.interval.ms``). A consumer with a ``schedule`` (the executor) reads ahead
instead: records are decoded into a :class:`~toolfleet.bus.scheduler.Backlog` and
started by priority, fairly across tenants, within a per-tenant bound; a queued record
is unfinished for commits like a running one. A record's outputs are published and
acknowledged before it counts as finished, and a partition is committed only up to its
lowest unfinished offset (:mod:`toolfleet.bus.offsets`): at-least-once, with dedupe by
``source``+``id`` making redeliveries harmless. Undecodable or invalid input goes to the
DLQ and the consumer keeps going. Transient infrastructure errors are retried with
full-jitter backoff for as long as it takes; anything else is retried a few times, then
dead-lettered with the original bytes.

How a consumer waits for records and how it leaves its group are its broker profile's
(:mod:`toolfleet.bus.profile`): long polls and LeaveGroup by default, another
profile when the process was given it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis.exceptions
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, KafkaError
from opentelemetry.trace import SpanKind
from prometheus_client import Counter, Histogram
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_random_exponential

from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.dedupe import ProcessedEvents
from toolfleet.bus.dlq import dlq_message
from toolfleet.bus.offsets import OffsetTracker, Partition
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.bus.profile import BrokerProfile, FetchPacing, PacingInput, built_in_profile
from toolfleet.bus.scheduler import Backlog, Placement
from toolfleet.errors import ErrorCode, ErrorInfo, InvalidEvent, ToolfleetError
from toolfleet.events.codec import decode
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import trace_id_of, valid_traceparent, with_trace
from toolfleet.observability import metrics
from toolfleet.observability.logs import log_context
from toolfleet.observability.tracing import batch_span, recording, span, trace_root
from toolfleet.settings import FleetSettings
from toolfleet.storage.errors import POSTGRES_UNAVAILABLE

log = logging.getLogger(__name__)
T = TypeVar("T")

#: How often a pattern-subscribed consumer refreshes its metadata, so a topic created
#: after it started (a new executor pool's) is found within seconds, not aiokafka's 5 min.
PATTERN_METADATA_MAX_AGE_MS = 5_000

#: Retries (after the first attempt) of an unexpected, non-transient handler error
#: before the message is dead-lettered: three attempts in all.
_MAX_UNEXPECTED_ATTEMPTS = 2


@dataclass(frozen=True, slots=True, kw_only=True)
class Inbound:
    """One decoded record handed to a service's handler."""

    envelope: Envelope
    topic: str
    partition: int
    offset: int
    key: bytes | None


Handler = Callable[[Inbound], Awaitable[Sequence[Outbound]]]
BatchHandler = Callable[[Sequence[Inbound]], Awaitable[Sequence[Outbound]]]


@dataclass(frozen=True, slots=True)
class ByBatch:
    """A handler of whole fetches, for consumers that only observe (audit, status).

    The records of one fetch are decoded, deduplicated in one round trip, handled by
    one call of ``handle`` (which returns the outputs of all of them), published
    together, and marked processed in one round trip: no task, span or retry frame per
    record. Same guarantees as a per-record handler: outputs are acknowledged before
    any offset of the batch is committed, a transient failure retries the whole batch,
    and if the batch fails otherwise its records are handled one by one, so a record
    that cannot be handled is dead-lettered alone. ``handle`` must therefore be
    idempotent per record (audit ids and status projection are).
    """

    handle: BatchHandler


@dataclass(slots=True)
class _Work:
    """What one task handles: the partitions of its records, and how many there are."""

    parts: frozenset[Partition]
    records: int


@dataclass(slots=True)
class _Claimed:
    """A decoded record of a batch, claimed against its in-flight twin."""

    record: ConsumerRecord[bytes, bytes]
    part: Partition
    inbound: Inbound
    key: str


@dataclass(frozen=True, kw_only=True)
class ConsumerSpec:
    """What one consumer of a service reads and how."""

    service: str
    """Service name (metrics label, log field)."""
    source: str
    """The service's ``source`` URI, used on its DLQ records."""
    group_id: str
    topics: Sequence[str]
    max_in_flight: int = 256
    auto_offset_reset: str = "earliest"
    revoke_grace_s: float = 2.0
    """On a rebalance, how long in-flight records of revoked partitions may finish."""
    on_revoke: Callable[[Sequence[Partition]], None] | None = None
    """Told first when partitions are revoked, so in-flight work of theirs can wind down
    at a safe point within ``revoke_grace_s`` (the executor suspends tools at their next
    checkpoint) instead of being cancelled mid-way."""
    commit_interval_s: float = 0.2
    fetch_max_wait_ms: int | None = None
    """Overrides ``TOOLFLEET_FETCH_MAX_WAIT_MS`` for this consumer."""
    observer: bool = False
    """Off the outcome's critical path (audit, status, policy's reading of outcomes): its
    broker profile may fetch for it less eagerly, collecting several hops per fetch."""
    extra_transient: tuple[type[BaseException], ...] = field(default_factory=tuple)
    """More exception types to treat as transient (retried without limit)."""
    schedule: Callable[[Envelope], Placement] | None = None
    """Opt-in scheduling: where a decoded record goes in the backlog (rank, tenant). Must
    not raise. Unset: every record starts as soon as it is fetched (the default)."""
    starts_traces: bool = False
    """This consumer records the root span of the trace an event that arrived without
    ``traceparent`` starts (:func:`~toolfleet.observability.tracing.trace_root`). One
    service of the fleet does (policy, the first to read a request); every service
    gives such an event the same derived ``traceparent`` anyway."""
    max_in_flight_per_tenant: int | None = None
    """With ``schedule``: records of one tenant running at once; None: no bound."""
    read_ahead: int | None = None
    """With ``schedule``: records fetched beyond ``max_in_flight`` and queued for
    scheduling; None: ``max(max_in_flight, 64)``."""
    pattern: str | None = None
    """Subscribe to every topic this regular expression matches instead of ``topics``
    (an observer reads every executor pool's topic, those created after it started too:
    :func:`toolfleet.events.routing.subscription_pattern`); ``topics`` still names the
    known ones (pacing). New matching topics are found within
    :data:`PATTERN_METADATA_MAX_AGE_MS` and read from their beginning (``earliest``)."""
    on_assign: Callable[[Sequence[Partition]], None] | None = None
    """Told the partitions the group assigned this consumer, after every rebalance (the
    executor announces them, so calls can be handed to the owner of a partition)."""

    @property
    def backlog_limit(self) -> int:
        """Records queued (not started) past which the consumer stops fetching."""
        return self.read_ahead if self.read_ahead is not None else max(self.max_in_flight, 64)


@dataclass(frozen=True, slots=True)
class _Queued:
    """A fetched, decoded record waiting in the backlog."""

    record: ConsumerRecord[bytes, bytes]
    part: Partition
    envelope: Envelope


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, ToolfleetError):
        return False  # handlers turn these into outcomes; one that escapes is a bug
    # Connection trouble with Kafka, Redis or Postgres: wait it out, never dead-letter.
    return isinstance(
        exc,
        (
            ConnectionError,
            TimeoutError,
            KafkaError,
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
            *POSTGRES_UNAVAILABLE,
        ),
    )


class EventConsumer:
    """Consumes ``spec.topics`` in ``spec.group_id`` and runs ``handler`` per event."""

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
        self._producer = producer
        self._processed = processed
        self._dlq_topic = dlq_topic
        self._tracker = OffsetTracker()
        self._tasks: dict[asyncio.Task[None], _Work] = {}
        self._in_flight = 0
        """Records being handled (a batch task holds several)."""
        self._in_flight_keys: set[str] = set()
        self._stopping = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._paused = False
        self._task_done = asyncio.Event()
        self._backlog: Backlog[_Queued] | None = (
            Backlog(max_running_per_tenant=spec.max_in_flight_per_tenant)
            if spec.schedule is not None
            else None
        )
        if isinstance(handler, ByBatch) and self._backlog is not None:
            raise ValueError("a scheduling consumer handles records one by one")
        self._stop_requested: asyncio.Event | None = None
        self._profile = profile
        self._pacing: FetchPacing | None = None
        self.assigned = asyncio.Event()
        """Set once the consumer has been assigned partitions (tests)."""
        self.joined = asyncio.Event()
        """Set once the consumer has joined its group, with or without partitions (a member
        beyond the partition count gets none and is still in its group): readiness."""
        # Metric children bound once: a ``labels()`` lookup per record was 6% of audit.
        # The in-flight gauge is read when scraped, not set twice per record.
        alive = weakref.ref(self)
        metrics.IN_FLIGHT.labels(spec.service).set_function(
            lambda: float(runtime._in_flight) if (runtime := alive()) is not None else 0.0
        )
        self._duplicates = metrics.DUPLICATES_SKIPPED.labels(spec.service)
        self._per_type: dict[tuple[str, str], tuple[Counter, Histogram]] = {}

    @property
    def handler(self) -> Handler | ByBatch:
        return self._handler

    @property
    def deduplicates(self) -> bool:
        """Whether it skips records its group marked processed (Redis markers)."""
        return self._processed is not None

    @property
    def queued(self) -> int:
        """Records fetched and waiting in the backlog (scheduling consumers only)."""
        return len(self._backlog) if self._backlog is not None else 0

    # --- lifecycle -----------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set, then drain in-flight work and commit."""
        profile = self._profile or built_in_profile(self._settings)
        self._profile = profile
        pacing = profile.pacing(pacing_input(self.spec))
        consumer = AIOKafkaConsumer(**consumer_kwargs(self._settings, self.spec, pacing))
        self._consumer = consumer
        self._stop_requested = stop
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
            self._stopping.set()
            await self._drain(self._settings.drain_timeout_s)
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
                free = self.spec.max_in_flight - self._in_flight
                if self._backlog is not None:
                    free += self.spec.backlog_limit - len(self._backlog)
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
        if isinstance(self._handler, ByBatch):
            fetched = [record for records in batch.values() for record in records]
            if fetched:
                self._dispatch_fetch(fetched)
            return
        if self._backlog is None:
            for records in batch.values():
                for record in records:
                    self._dispatch(record)
            return
        for records in batch.values():
            for record in records:
                self._enqueue(record, self._backlog)
        self._start_ready()

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

    async def _drain(self, timeout_s: float) -> None:
        if self._tasks:
            log.info("draining in-flight events", extra={"in_flight": len(self._tasks)})
            _, pending = await asyncio.wait(list(self._tasks), timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    # --- per record ----------------------------------------------------------------

    def _dispatch(self, record: ConsumerRecord[bytes, bytes]) -> None:
        part = Partition(record.topic, record.partition)
        self._tracker.started(part, record.offset)
        self._start(record, part, None)

    def _enqueue(self, record: ConsumerRecord[bytes, bytes], backlog: Backlog[_Queued]) -> None:
        """Decode ``record`` once and queue it; undecodable input goes to the DLQ now."""
        part = Partition(record.topic, record.partition)
        self._tracker.started(part, record.offset)  # queued is unfinished: not committed
        try:
            envelope = self._decode(record)
        except InvalidEvent as exc:
            self._start(record, part, exc)
            return
        assert self.spec.schedule is not None
        backlog.push(_Queued(record, part, envelope), self.spec.schedule(envelope))

    def _start_ready(self) -> None:
        """Start queued records while slots are free, in the backlog's order."""
        backlog = self._backlog
        if backlog is None or self._stopping.is_set():
            return
        if self._stop_requested is not None and self._stop_requested.is_set():
            return  # queued records are left unfinished: the next owner reads them
        while self._in_flight < self.spec.max_in_flight:
            picked = backlog.pop()
            if picked is None:
                return
            queued, tenant = picked
            task = self._start(queued.record, queued.part, queued.envelope)
            task.add_done_callback(functools.partial(self._after_scheduled, tenant))

    def _after_scheduled(self, tenant: str, _task: asyncio.Task[None]) -> None:
        assert self._backlog is not None
        self._backlog.done(tenant)
        self._start_ready()

    def _start(
        self,
        record: ConsumerRecord[bytes, bytes],
        part: Partition,
        decoded: Envelope | InvalidEvent | None,
    ) -> asyncio.Task[None]:
        return self._track(self._process(record, part, decoded), frozenset((part,)), 1)

    def _dispatch_fetch(self, records: list[ConsumerRecord[bytes, bytes]]) -> None:
        parts = frozenset(Partition(r.topic, r.partition) for r in records)
        for record in records:
            self._tracker.started(Partition(record.topic, record.partition), record.offset)
        self._track(self._process_fetch(records), parts, len(records))

    def _track(
        self, work: Coroutine[None, None, None], parts: frozenset[Partition], records: int
    ) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks[task] = _Work(parts, records)
        self._in_flight += records
        task.add_done_callback(self._forget_task)
        return task

    def _decode(self, record: ConsumerRecord[bytes, bytes]) -> Envelope:
        if record.value is not None and len(record.value) > self._settings.max_event_bytes:
            raise InvalidEvent(
                "message larger than the configured limit",
                details={"bytes": len(record.value), "limit": self._settings.max_event_bytes},
            )
        # Where a request without a trace gets one: every stage downstream inherits it.
        return with_trace(decode(key=record.key, value=record.value, headers=record.headers))

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        work = self._tasks.pop(task, None)
        if work is not None:
            self._in_flight -= work.records
        if not task.cancelled() and task.exception() is not None:  # pragma: no cover
            log.error("record task crashed", exc_info=task.exception())

    async def _process(
        self,
        record: ConsumerRecord[bytes, bytes],
        part: Partition,
        decoded: Envelope | InvalidEvent | None = None,
    ) -> None:
        """Handle one record; ``decoded`` is its envelope (or why it is not one) when the
        backlog decoded it already."""
        started = time.perf_counter()
        event_type = "unknown"
        outcome = "ok"
        traceparent: str | None = None
        try:
            if isinstance(decoded, InvalidEvent):
                raise decoded
            envelope = self._decode(record) if decoded is None else decoded
            event_type = envelope.type
            traceparent = envelope.traceparent
            key = envelope.dedupe_key
            if key in self._in_flight_keys:
                self._duplicates.inc()
                outcome = "duplicate"
                return
            self._in_flight_keys.add(key)  # claimed before any await: no race with a twin
            try:
                processed = self._processed
                if processed is not None and await self._retrying(lambda: processed.seen(key)):
                    self._duplicates.inc()
                    outcome = "duplicate"
                    return
                inbound = Inbound(
                    envelope=envelope,
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    key=record.key,
                )
                await self._handle_and_emit(inbound)
                if processed is not None:
                    await self._retrying(lambda: processed.mark(key))
            finally:
                self._in_flight_keys.discard(key)
        except asyncio.CancelledError:
            # Revoked or shut down mid-way: leave the offset unfinished so it is redelivered.
            outcome = "abandoned"
            raise
        except InvalidEvent as exc:
            outcome = "dlq"
            await self._dead_letter(record, exc.to_error_info(), traceparent)
        except Exception as exc:
            outcome = "dlq"
            log.exception("giving up on event", extra={"event_type": event_type})
            await self._dead_letter(record, _failure_info(exc), traceparent)
        finally:
            if outcome != "abandoned":
                self._tracker.finished(part, record.offset)
            counted, timed = self._metrics_of(event_type, outcome)
            counted.inc()
            timed.observe(time.perf_counter() - started)

    def _metrics_of(self, event_type: str, outcome: str) -> tuple[Counter, Histogram]:
        bound = self._per_type.get((event_type, outcome))
        if bound is None:
            service = self.spec.service
            label = metrics.event_type_label(event_type)  # from the wire: a known one
            bound = (
                metrics.EVENTS_PROCESSED.labels(service, label, outcome),
                metrics.PROCESSING_SECONDS.labels(service, label),
            )
            if len(self._per_type) < 1024:  # the cache is keyed by the wire's text
                self._per_type[(event_type, outcome)] = bound
        return bound

    async def _handle_and_emit(self, inbound: Inbound) -> None:
        env = inbound.envelope
        with (
            log_context(
                tenant_id=env.tenantid,
                invocation_id=env.invocationid,
                trace_id=trace_id_of(env.traceparent),
                event_type=env.type,
            ),
            # No span would be recorded: build none.
            self._spans(inbound) if recording() else contextlib.nullcontext(),
        ):
            await self._retrying(lambda: self._handle_once(inbound))

    @contextlib.contextmanager
    def _spans(self, inbound: Inbound) -> Iterator[None]:
        """The record's consumer span (and the trace's root, for the consumer that starts
        traces)."""
        env = inbound.envelope
        attributes: dict[str, str | int] = {
            "messaging.destination.name": inbound.topic,
            "messaging.kafka.offset": inbound.offset,
            "toolfleet.service": self.spec.service,
        }
        with (
            (
                trace_root(
                    f"start {env.type}",
                    traceparent=env.traceparent,
                    source=env.source,
                    event_id=env.id,
                    attributes=attributes,
                )
                if self.spec.starts_traces
                else contextlib.nullcontext()
            ),
            span(
                f"process {env.type}",
                kind=SpanKind.CONSUMER,
                traceparent=env.traceparent,
                tracestate=env.tracestate,
                attributes=attributes,
            ),
        ):
            yield

    async def _handle_once(self, inbound: Inbound) -> None:
        handler = self._handler
        outputs = await (
            handler.handle([inbound]) if isinstance(handler, ByBatch) else handler(inbound)
        )
        await self._producer.send_all(outputs)

    # --- per fetch (ByBatch) ---------------------------------------------------------

    async def _process_fetch(self, records: list[ConsumerRecord[bytes, bytes]]) -> None:
        """Handle the records of one fetch as one batch (:class:`ByBatch`)."""
        started = time.perf_counter()
        counts: list[tuple[str, str]] = []
        claimed: list[_Claimed] = []
        unfinished = {id(record): record for record in records}

        def finish(record: ConsumerRecord[bytes, bytes], event_type: str, outcome: str) -> None:
            unfinished.pop(id(record), None)
            self._tracker.finished(Partition(record.topic, record.partition), record.offset)
            counts.append((event_type, outcome))

        try:
            for record in records:
                try:
                    envelope = self._decode(record)
                except InvalidEvent as exc:
                    await self._dead_letter(record, exc.to_error_info(), None)
                    finish(record, "unknown", "dlq")
                    continue
                key = envelope.dedupe_key
                if key in self._in_flight_keys:
                    self._duplicates.inc()
                    finish(record, envelope.type, "duplicate")
                    continue
                self._in_flight_keys.add(key)  # claimed before any await
                part = Partition(record.topic, record.partition)
                inbound = Inbound(
                    envelope=envelope,
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    key=record.key,
                )
                claimed.append(_Claimed(record, part, inbound, key))
            try:
                fresh = await self._unseen(claimed, finish)
                if fresh:
                    done = await self._handle_fetch(fresh, finish)
                    processed = self._processed
                    keys = [item.key for item in done]
                    if processed is not None and keys:
                        await self._retrying(lambda: processed.mark_all(keys))
                    for item in done:
                        finish(item.record, item.inbound.envelope.type, "ok")
            finally:
                for item in claimed:
                    self._in_flight_keys.discard(item.key)
        except asyncio.CancelledError:
            # Revoked or shut down mid-way: what is unfinished is redelivered.
            raise
        finally:
            elapsed = time.perf_counter() - started
            for event_type, outcome in counts:
                counted, timed = self._metrics_of(event_type, outcome)
                counted.inc()
                timed.observe(elapsed)
            if unfinished:
                counted, _ = self._metrics_of("unknown", "abandoned")
                counted.inc(len(unfinished))

    async def _unseen(
        self,
        claimed: list[_Claimed],
        finish: Callable[[ConsumerRecord[bytes, bytes], str, str], None],
    ) -> list[_Claimed]:
        processed = self._processed
        if processed is None or not claimed:
            return claimed
        keys = [item.key for item in claimed]
        seen = await self._retrying(lambda: processed.seen_all(keys))
        fresh: list[_Claimed] = []
        for item, was in zip(claimed, seen, strict=True):  # in fetch order
            if was:
                self._duplicates.inc()
                finish(item.record, item.inbound.envelope.type, "duplicate")
            else:
                fresh.append(item)
        return fresh

    async def _handle_fetch(
        self,
        items: list[_Claimed],
        finish: Callable[[ConsumerRecord[bytes, bytes], str, str], None],
    ) -> list[_Claimed]:
        """Handle ``items`` together; those handled, the rest were dead-lettered (and
        finished). A failure a stop interrupted leaves every item unfinished."""
        try:
            await self._handle_batch(items)
            return items
        except InvalidEvent:
            pass  # one of them is bad: find which below
        except Exception as exc:
            if self._stopping.is_set():
                raise asyncio.CancelledError from exc
            if len(items) > 1:
                log.warning(
                    "batch failed; handling its records one by one",
                    extra={"error": type(exc).__name__, "records": len(items)},
                )
        done: list[_Claimed] = []
        for item in items:
            envelope = item.inbound.envelope
            try:
                await self._handle_batch([item])
            except InvalidEvent as exc:
                await self._dead_letter(
                    item.record,
                    exc.to_error_info(),
                    envelope.traceparent,
                )
                finish(item.record, envelope.type, "dlq")
                continue
            except Exception as exc:
                if self._stopping.is_set():
                    raise asyncio.CancelledError from exc
                log.exception("giving up on event", extra={"event_type": envelope.type})
                await self._dead_letter(item.record, _failure_info(exc), envelope.traceparent)
                finish(item.record, envelope.type, "dlq")
                continue
            done.append(item)
        return done

    async def _handle_batch(self, items: list[_Claimed]) -> None:
        handler = self._handler
        assert isinstance(handler, ByBatch)
        inbounds = [item.inbound for item in items]
        with batch_span(
            f"process {self.spec.service} batch",
            traceparents=[i.envelope.traceparent for i in inbounds],
            attributes={
                "messaging.batch.message_count": len(inbounds),
                "toolfleet.service": self.spec.service,
            },
        ):

            async def once() -> None:
                await self._producer.send_all(await handler.handle(inbounds))

            await self._retrying(once)

    async def _retrying(self, step: Callable[[], Awaitable[T]]) -> T:
        """Run ``step``; transient failures retry without limit, others a few times."""
        try:  # the fast path: no retry machinery unless something failed
            return await step()
        except InvalidEvent:
            raise
        except Exception as exc:
            if self._stopping.is_set():
                raise
            log.warning("step failed, retrying", extra={"error": type(exc).__name__})
        async for attempt in AsyncRetrying(
            # A cancel (a revoke past its grace, a stop) ends the retries: tenacity would
            # take it for one more failure and run the step again, uncancelled.
            retry=retry_if_exception(
                lambda e: not isinstance(e, (InvalidEvent, asyncio.CancelledError))
            ),
            stop=self._should_stop_retrying,
            wait=wait_random_exponential(multiplier=0.05, max=5),
            reraise=True,
        ):
            with attempt:
                return await step()
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    def _should_stop_retrying(self, state: RetryCallState) -> bool:
        if self._stopping.is_set():
            return True
        exc = state.outcome.exception() if state.outcome else None
        if exc is not None and (_is_transient(exc) or isinstance(exc, self.spec.extra_transient)):
            log.warning("transient failure, retrying", extra={"error": type(exc).__name__})
            return False
        return state.attempt_number >= _MAX_UNEXPECTED_ATTEMPTS

    async def _dead_letter(
        self,
        record: ConsumerRecord[bytes, bytes],
        error: ErrorInfo,
        traceparent: str | None,
    ) -> None:
        """Publish ``record`` to the DLQ in the trace of the event it was (``traceparent``),
        else of the ``ce_traceparent`` header it carries, else in a trace of its own."""
        metrics.DLQ_RECORDS.labels(self.spec.service, error.code).inc()
        log.warning(
            "dead-lettered message",
            extra={
                "topic": record.topic,
                "partition": record.partition,
                "offset": record.offset,
                "error_code": str(error.code),
            },
        )
        headers = list(record.headers)
        message = dlq_message(
            source=self.spec.source,
            consumer_group=self.spec.group_id,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            timestamp_ms=record.timestamp,
            key=record.key,
            headers=headers,
            value=record.value,
            error=error,
            traceparent=traceparent or _header_traceparent(headers),
        )
        async for attempt in AsyncRetrying(
            wait=wait_random_exponential(multiplier=0.05, max=5), reraise=True
        ):
            with attempt:
                await await_ack(await self._producer.send_wire(self._dlq_topic, message))

    # --- commits and rebalances ------------------------------------------------------

    async def _commit_loop(self) -> None:
        while True:
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
        offsets = self._tracker.committable(wanted)
        if not offsets:
            return
        try:
            await consumer.commit(
                {TopicPartition(p.topic, p.partition): off for p, off in offsets.items()}
            )
            self._tracker.mark_committed(offsets)
        except (CommitFailedError, KafkaError) as exc:
            # A rebalance is under way; the next owner re-reads from the last commit.
            level = logging.INFO if final else logging.WARNING
            log.log(level, "commit failed", extra={"error": type(exc).__name__})

    async def release(self, revoked: Sequence[Partition]) -> None:
        """Called on revoke: let in-flight work of those partitions finish, then commit."""
        revoked_set = set(revoked)
        if self._backlog is not None:
            # Not started, so not ours to finish: unfinished, the next owner reads them.
            self._backlog.drop(lambda queued: queued.part in revoked_set)
        mine = [t for t, work in self._tasks.items() if not work.parts.isdisjoint(revoked_set)]
        if mine:
            if self.spec.on_revoke is not None:
                self.spec.on_revoke(list(revoked_set))
            _, pending = await asyncio.wait(mine, timeout=self.spec.revoke_grace_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
        await self._commit(list(revoked_set))
        self._tracker.forget(revoked_set)


def pacing_input(spec: ConsumerSpec) -> PacingInput:
    """What a consumer of ``spec`` asks of its broker profile."""
    return PacingInput(
        topics=frozenset(spec.topics),
        fetch_max_wait_ms=spec.fetch_max_wait_ms,
        observer=spec.observer,
    )


def consumer_kwargs(
    settings: FleetSettings, spec: ConsumerSpec, pacing: FetchPacing
) -> dict[str, Any]:
    """The ``AIOKafkaConsumer`` arguments of a consumer of ``spec``: its group, manual
    commits, and fetch requests the broker holds ``pacing.broker_wait_ms`` at most."""
    return {
        **connection_kwargs(settings),
        "group_id": spec.group_id,
        "client_id": f"toolfleet-{spec.service}",
        "enable_auto_commit": False,
        "auto_offset_reset": spec.auto_offset_reset,
        "fetch_max_wait_ms": pacing.broker_wait_ms,
        "max_partition_fetch_bytes": max(settings.max_event_bytes * 2, 1_048_576),
        "session_timeout_ms": settings.session_timeout_ms,
        "heartbeat_interval_ms": max(500, settings.session_timeout_ms // 3),
        "max_poll_interval_ms": 300_000,
        **(
            {"metadata_max_age_ms": PATTERN_METADATA_MAX_AGE_MS} if spec.pattern is not None else {}
        ),
    }


def _failure_info(exc: Exception) -> ErrorInfo:
    """What a DLQ record says of a handler's failure: its typed error, else only the
    exception's type (its message may carry data)."""
    if isinstance(exc, ToolfleetError):
        return exc.to_error_info()
    return ErrorInfo(
        code=ErrorCode.INTERNAL_ERROR,
        message=f"handler failed: {type(exc).__name__}",
        retryable=True,
    )


def _header_traceparent(headers: Sequence[tuple[str, bytes]]) -> str | None:
    """A valid ``ce_traceparent`` header of a binary-mode message that did not decode."""
    for name, value in headers:
        if name.lower() == "ce_traceparent":
            return valid_traceparent(value.decode("ascii", errors="replace"))
    return None


async def await_ack(future: asyncio.Future[object]) -> None:
    await future


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
