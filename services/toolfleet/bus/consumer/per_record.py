"""Records handled one at a time: as soon as fetched (:class:`PerRecord`), or from a
backlog by priority, fairly across tenants (:class:`Scheduled`, the executor's).

Each record is a task of its own, in its own span, with its own retries: decoded,
deduplicated against its in-flight twin and the group's markers, handled, its outputs
published and acknowledged, then marked processed and finished for commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from aiokafka import ConsumerRecord
from opentelemetry.trace import SpanKind

from toolfleet.bus.consumer.core import ConsumerCore, Mode, failure_info
from toolfleet.bus.consumer.spec import Handler, Inbound
from toolfleet.bus.offsets import Partition
from toolfleet.bus.scheduler import Backlog, Placement
from toolfleet.errors import InvalidEvent
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import trace_id_of
from toolfleet.observability.logs import log_context
from toolfleet.observability.tracing import recording, span, trace_root

# One consumer, one logger, whichever mode hands its records over.
log = logging.getLogger("toolfleet.bus.runtime")


class PerRecord(Mode):
    """Every fetched record starts at once as a task of its own (the default)."""

    def __init__(self, core: ConsumerCore, handler: Handler) -> None:
        super().__init__(core)
        self._handler = handler

    def dispatch(self, records: Sequence[ConsumerRecord[bytes, bytes]]) -> None:
        for record in records:
            part = Partition(record.topic, record.partition)
            self.core.tracker.started(part, record.offset)
            self._start(record, part, None)

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
                inbound = Inbound(
                    envelope=envelope,
                    topic=record.topic,
                    partition=record.partition,
                    offset=record.offset,
                    key=record.key,
                )
                await self._handle_and_emit(inbound)
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
            log.exception("giving up on event", extra={"event_type": event_type})
            await core.dead_letter(record, failure_info(exc), traceparent)
        finally:
            if outcome != "abandoned":
                core.tracker.finished(part, record.offset)
            counted, timed = core.metrics_of(event_type, outcome)
            counted.inc()
            timed.observe(time.perf_counter() - started)

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
            await self.core.retrying(lambda: self._handle_once(inbound))

    @contextlib.contextmanager
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
