"""Records handled one at a time: as soon as fetched (:class:`PerRecord`), or from a
backlog by priority, fairly across tenants (:class:`Scheduled`, the executor's).

Each record is a task of its own, in its own span, with its own retries: decoded,
deduplicated against its in-flight twin and the group's markers, handled, its outputs
published and acknowledged, then marked processed and finished for commits. Where the
group keeps markers, :class:`PerRecord` asks about a partition's records of one fetch
together and marks them together once each is handled (a partition commits no further
than its slowest record anyway): a question and a mark per partition of a fetch rather
than two waits per record, which with their futures and resumptions were about a fifth
of the runtime's instructions per record (``bench/runtime_record_bench.py``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from aiokafka import ConsumerRecord
from opentelemetry.trace import SpanKind

from toolfleet.bus.consumer.core import ConsumerCore, Mode, failure_info
from toolfleet.bus.consumer.spec import Handler, Inbound
from toolfleet.bus.dedupe import ProcessedEvents
from toolfleet.bus.offsets import Partition
from toolfleet.bus.scheduler import Backlog, Placement
from toolfleet.errors import InvalidEvent
from toolfleet.events.envelope import Envelope
from toolfleet.observability.logs import log_context
from toolfleet.observability.tracing import recording, span, trace_root

# One consumer, one logger, whichever mode hands its records over.
log = logging.getLogger("toolfleet.bus.runtime")
_NO_SPAN = nullcontext()


@dataclass(slots=True)
class _Claimed:
    """A decoded record of a fetch-partition, claimed against its in-flight twin."""

    record: ConsumerRecord[bytes, bytes]
    envelope: Envelope
    key: str
    handled_at: float | None = None
    """When its outputs were acknowledged (``perf_counter``): it is marked next."""
    finished: bool = False
    """Finished for commits (handled and marked, a duplicate, or dead-lettered)."""


class _Join:
    """Tasks started together and waited for together. Each counts itself out as it
    ends (:meth:`count_out`, in its ``finally``), so waiting costs no callback per task
    (``asyncio.wait`` adds one to each, and a task's own callbacks a turn of the loop)."""

    __slots__ = ("_done", "_running", "_tasks")

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[None]] = []
        self._running = 0
        self._done: asyncio.Future[None] | None = None

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work``, which calls :meth:`count_out` once it ends, whichever way."""
        self._running += 1
        self._tasks.append(asyncio.create_task(work))

    def count_out(self) -> None:
        self._running -= 1
        if self._running == 0 and self._done is not None and not self._done.done():
            self._done.set_result(None)

    async def all_done(self) -> None:
        if self._running:
            self._done = asyncio.get_running_loop().create_future()
            await self._done

    async def cancel(self) -> None:
        """Cancel the tasks still running, and wait until they are over."""
        running = [task for task in self._tasks if not task.done()]
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)


class PerRecord(Mode):
    """Every fetched record starts at once as a task of its own (the default)."""

    def __init__(self, core: ConsumerCore, handler: Handler) -> None:
        super().__init__(core)
        self._handler = handler

    def dispatch(self, records: Sequence[ConsumerRecord[bytes, bytes]]) -> None:
        core = self.core
        if core.processed is None:
            for record in records:
                part = Partition(record.topic, record.partition)
                core.tracker.started(part, record.offset)
                self._start(record, part, None)
            return
        by_part: dict[Partition, list[ConsumerRecord[bytes, bytes]]] = {}
        for record in records:
            part = Partition(record.topic, record.partition)
            core.tracker.started(part, record.offset)
            by_part.setdefault(part, []).append(record)
        for part, same in by_part.items():
            core.track(
                self._process_partition(core.processed, part, same), frozenset((part,)), len(same)
            )

    def _start(
        self,
        record: ConsumerRecord[bytes, bytes],
        part: Partition,
        decoded: Envelope | InvalidEvent | None,
    ) -> asyncio.Task[None]:
        return self.core.track(self._process(record, part, decoded), frozenset((part,)), 1)

    async def _process(
        self,
        record: ConsumerRecord[bytes, bytes],
        part: Partition,
        decoded: Envelope | InvalidEvent | None = None,
    ) -> None:
        """Handle one record; ``decoded`` is its envelope (or why it is not one) when the
        backlog decoded it already."""
        core = self.core
        started = time.perf_counter()
        event_type = "unknown"
        outcome = "ok"
        traceparent: str | None = None
        try:
            if isinstance(decoded, InvalidEvent):
                raise decoded
            envelope = core.decode(record) if decoded is None else decoded
            event_type = envelope.type
            traceparent = envelope.traceparent
            key = envelope.dedupe_key
            if key in core.in_flight_keys:
                core.duplicates.inc()
                outcome = "duplicate"
                return
            core.in_flight_keys.add(key)  # claimed before any await: no race with a twin
            try:
                processed = core.processed
                if processed is not None and await core.retrying(lambda: processed.seen(key)):
                    core.duplicates.inc()
                    outcome = "duplicate"
                    return
                await self._handle_and_emit(record, envelope)
                if processed is not None:
                    await core.retrying(lambda: processed.mark(key))
            finally:
                core.in_flight_keys.discard(key)
        except asyncio.CancelledError:
            # Revoked or shut down mid-way: leave the offset unfinished so it is redelivered.
            outcome = "abandoned"
            raise
        except InvalidEvent as exc:
            outcome = "dlq"
            await core.dead_letter(record, exc.to_error_info(), traceparent)
        except Exception as exc:
            outcome = "dlq"
            await self._give_up(record, event_type, traceparent, exc)
        finally:
            if outcome != "abandoned":
                core.tracker.finished(part, record.offset)
            self._count(event_type, outcome, started)

    async def _process_partition(
        self,
        processed: ProcessedEvents,
        part: Partition,
        records: list[ConsumerRecord[bytes, bytes]],
    ) -> None:
        """Handle one partition's records of a fetch, each in a task of its own, asking
        the group's markers about them in one call and marking the handled ones in one
        call once all of them are handled. A call that fails for good sends the records
        it was for to the DLQ, as it would have sent each record that asked alone.

        This task holds the records (for commits, the in-flight count and a revoke);
        their tasks are its own: cancelled with it, and over before it is."""
        core = self.core
        started = time.perf_counter()
        join = _Join()
        claimed: list[_Claimed] = []
        try:
            for record in records:
                try:
                    envelope = core.decode(record)
                except InvalidEvent as exc:  # to the DLQ, in a task of its own
                    join.start(self._dead_letter_alone(join, record, part, exc))
                    continue
                key = envelope.dedupe_key
                if key in core.in_flight_keys:
                    core.duplicates.inc()
                    self._finish(record, part, envelope.type, "duplicate", started)
                    continue
                core.in_flight_keys.add(key)  # claimed before any await: no race with a twin
                claimed.append(_Claimed(record, envelope, key))
            for item in await self._unseen(processed, part, claimed, started):
                join.start(self._handle_claimed(join, part, item, started))
            await join.all_done()
            handled = [item for item in claimed if item.handled_at is not None]
            if handled:
                try:
                    await core.retrying(lambda: processed.mark_all([i.key for i in handled]))
                except Exception as exc:
                    await self._give_up_all(part, handled, exc, started)
                    return
                for item in handled:  # timed to its own end, not its slowest sibling's
                    self._finish(
                        item.record, part, item.envelope.type, "ok", started, item.handled_at
                    )
                    item.finished = True
        except asyncio.CancelledError:
            # Revoked or shut down: its records' tasks go too, and are over before this
            # one is (a revoke waits for this task only, then forgets the partition).
            await join.cancel()
            raise
        finally:
            for item in claimed:
                core.in_flight_keys.discard(item.key)
                if not item.finished:  # revoked or shut down mid-way: redelivered
                    self._count(item.envelope.type, "abandoned", started)

    async def _unseen(
        self, processed: ProcessedEvents, part: Partition, claimed: list[_Claimed], started: float
    ) -> list[_Claimed]:
        """The records of ``claimed`` the group has no marker of (the others are finished
        as duplicates)."""
        if not claimed:
            return claimed
        try:
            seen = await self.core.retrying(
                lambda: processed.seen_all([item.key for item in claimed])
            )
        except Exception as exc:
            await self._give_up_all(part, claimed, exc, started)
            return []
        fresh: list[_Claimed] = []
        for item, was in zip(claimed, seen, strict=True):
            if was:
                self.core.duplicates.inc()
                self._finish(item.record, part, item.envelope.type, "duplicate", started)
                item.finished = True
            else:
                fresh.append(item)
        return fresh

    async def _handle_claimed(
        self, join: _Join, part: Partition, item: _Claimed, started: float
    ) -> None:
        """Handle one record of :meth:`_process_partition`: ``item.handled_at`` set once its
        outputs are acknowledged, else it went to the DLQ (and is finished)."""
        record, envelope = item.record, item.envelope
        try:
            try:
                await self._handle_and_emit(record, envelope)
                item.handled_at = time.perf_counter()
                return
            except InvalidEvent as exc:
                await self.core.dead_letter(record, exc.to_error_info(), envelope.traceparent)
            except Exception as exc:
                await self._give_up(record, envelope.type, envelope.traceparent, exc)
            self._finish(record, part, envelope.type, "dlq", started)
            item.finished = True
        finally:
            join.count_out()

    async def _dead_letter_alone(
        self, join: _Join, record: ConsumerRecord[bytes, bytes], part: Partition, exc: InvalidEvent
    ) -> None:
        try:
            await self._process(record, part, exc)
        finally:
            join.count_out()

    async def _give_up_all(
        self, part: Partition, items: list[_Claimed], exc: Exception, started: float
    ) -> None:
        for item in items:
            envelope = item.envelope
            await self._give_up(item.record, envelope.type, envelope.traceparent, exc)
            self._finish(item.record, part, envelope.type, "dlq", started)
            item.finished = True

    async def _give_up(
        self,
        record: ConsumerRecord[bytes, bytes],
        event_type: str,
        traceparent: str | None,
        exc: Exception,
    ) -> None:
        log.exception("giving up on event", extra={"event_type": event_type}, exc_info=exc)
        await self.core.dead_letter(record, failure_info(exc), traceparent)

    def _finish(
        self,
        record: ConsumerRecord[bytes, bytes],
        part: Partition,
        event_type: str,
        outcome: str,
        started: float,
        ended: float | None = None,
    ) -> None:
        self.core.tracker.finished(part, record.offset)
        self._count(event_type, outcome, started, ended)

    def _count(
        self, event_type: str, outcome: str, started: float, ended: float | None = None
    ) -> None:
        counted, timed = self.core.metrics_of(event_type, outcome)
        counted.inc()
        timed.observe((time.perf_counter() if ended is None else ended) - started)

    async def _handle_and_emit(
        self, record: ConsumerRecord[bytes, bytes], envelope: Envelope
    ) -> None:
        inbound = Inbound.of(record, envelope)
        with (
            log_context(
                tenant_id=envelope.tenantid,
                invocation_id=envelope.invocationid,
                traceparent=envelope.traceparent,  # written as its trace id
                event_type=envelope.type,
            ),
            self._spans(inbound) if recording() else _NO_SPAN,  # none unless recorded
        ):
            await self.core.retrying(lambda: self._handle_once(inbound))

    @contextmanager
    def _spans(self, inbound: Inbound) -> Iterator[None]:
        """The record's consumer span (and the trace's root, for the consumer that starts
        traces)."""
        env = inbound.envelope
        spec = self.core.spec
        attributes: dict[str, str | int] = {
            "messaging.destination.name": inbound.topic,
            "messaging.kafka.offset": inbound.offset,
            "toolfleet.service": spec.service,
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
                if spec.starts_traces
                else nullcontext()
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
        await self.core.producer.send_all(await self._handler(inbound))


@dataclass(frozen=True, slots=True)
class _Queued:
    """A fetched, decoded record waiting in the backlog."""

    record: ConsumerRecord[bytes, bytes]
    part: Partition
    envelope: Envelope


class Scheduled(PerRecord):
    """Reads ahead: fetched records are decoded into a :class:`Backlog` and started by
    priority, fairly across tenants, within a per-tenant bound. A queued record is
    unfinished for commits like a running one."""

    def __init__(
        self,
        core: ConsumerCore,
        handler: Handler,
        schedule: Callable[[Envelope], Placement],
    ) -> None:
        super().__init__(core, handler)
        self._schedule = schedule
        self._backlog: Backlog[_Queued] = Backlog(
            max_running_per_tenant=core.spec.max_in_flight_per_tenant
        )

    @property
    def queued(self) -> int:
        return len(self._backlog)

    def room(self) -> int:
        return super().room() + self.core.spec.backlog_limit - len(self._backlog)

    def dispatch(self, records: Sequence[ConsumerRecord[bytes, bytes]]) -> None:
        for record in records:
            self._enqueue(record)
        self._start_ready()

    def before_release(self, revoked: set[Partition]) -> None:
        # Not started, so not ours to finish: unfinished, the next owner reads them.
        self._backlog.drop(lambda queued: queued.part in revoked)

    def _enqueue(self, record: ConsumerRecord[bytes, bytes]) -> None:
        """Decode ``record`` once and queue it; undecodable input goes to the DLQ now."""
        part = Partition(record.topic, record.partition)
        self.core.tracker.started(part, record.offset)  # queued is unfinished: not committed
        try:
            envelope = self.core.decode(record)
        except InvalidEvent as exc:
            self._start(record, part, exc)
            return
        self._backlog.push(_Queued(record, part, envelope), self._schedule(envelope))

    def _start_ready(self) -> None:
        """Start queued records while slots are free, in the backlog's order."""
        core = self.core
        if core.stopping.is_set():
            return
        if core.stop_requested is not None and core.stop_requested.is_set():
            return  # queued records are left unfinished: the next owner reads them
        while core.in_flight < core.spec.max_in_flight:
            picked = self._backlog.pop()
            if picked is None:
                return
            queued, tenant = picked
            task = self._start(queued.record, queued.part, queued.envelope)
            task.add_done_callback(functools.partial(self._after_scheduled, tenant))

    def _after_scheduled(self, tenant: str, _task: asyncio.Task[None]) -> None:
        self._backlog.done(tenant)
        self._start_ready()
