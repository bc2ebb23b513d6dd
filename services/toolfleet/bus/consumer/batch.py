"""Whole fetches handled at once (:class:`~toolfleet.bus.consumer.spec.ByBatch`: audit,
status): one task, span and retry frame per fetch, not per record.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiokafka import ConsumerRecord

from toolfleet.bus.consumer.core import ConsumerCore, Mode, failure_info
from toolfleet.bus.consumer.spec import BatchHandler, Inbound
from toolfleet.bus.offsets import Partition
from toolfleet.errors import InvalidEvent
from toolfleet.observability.tracing import batch_span

# One consumer, one logger, whichever mode hands its records over.
log = logging.getLogger("toolfleet.bus.runtime")

_Finish = Callable[[ConsumerRecord[bytes, bytes], str, str], None]


@dataclass(slots=True)
class _Claimed:
    """A decoded record of a batch, claimed against its in-flight twin."""

    record: ConsumerRecord[bytes, bytes]
    part: Partition
    inbound: Inbound
    key: str


class Batched(Mode):
    """The records of one fetch are decoded, deduplicated in one round trip, handled by
    one call of the handler, published together, and marked processed in one round
    trip. If the batch fails otherwise than transiently, its records are handled one by
    one, so a record that cannot be handled is dead-lettered alone."""

    def __init__(self, core: ConsumerCore, handle: BatchHandler) -> None:
        super().__init__(core)
        self._handle = handle

    def dispatch(self, records: Sequence[ConsumerRecord[bytes, bytes]]) -> None:
        if not records:
            return
        parts = frozenset(Partition(r.topic, r.partition) for r in records)
        for record in records:
            self.core.tracker.started(Partition(record.topic, record.partition), record.offset)
        self.core.track(self._process_fetch(list(records)), parts, len(records))

    async def _process_fetch(self, records: list[ConsumerRecord[bytes, bytes]]) -> None:
        """Handle the records of one fetch as one batch."""
        core = self.core
        started = time.perf_counter()
        counts: list[tuple[str, str]] = []
        claimed: list[_Claimed] = []
        unfinished = {id(record): record for record in records}

        def finish(record: ConsumerRecord[bytes, bytes], event_type: str, outcome: str) -> None:
            unfinished.pop(id(record), None)
            core.tracker.finished(Partition(record.topic, record.partition), record.offset)
            counts.append((event_type, outcome))

        try:
            for record in records:
                try:
                    envelope = core.decode(record)
                except InvalidEvent as exc:
                    await core.dead_letter(record, exc.to_error_info(), None)
                    finish(record, "unknown", "dlq")
                    continue
                key = envelope.dedupe_key
                if key in core.in_flight_keys:
                    core.duplicates.inc()
                    finish(record, envelope.type, "duplicate")
                    continue
                core.in_flight_keys.add(key)  # claimed before any await
                part = Partition(record.topic, record.partition)
                inbound = Inbound.of(record, envelope)
                claimed.append(_Claimed(record, part, inbound, key))
            try:
                fresh = await self._unseen(claimed, finish)
                if fresh:
                    done = await self._handle_fetch(fresh, finish)
                    processed = core.processed
                    keys = [item.key for item in done]
                    if processed is not None and keys:
                        await core.retrying(lambda: processed.mark_all(keys))
                    for item in done:
                        finish(item.record, item.inbound.envelope.type, "ok")
            finally:
                for item in claimed:
                    core.in_flight_keys.discard(item.key)
        except asyncio.CancelledError:
            # Revoked or shut down mid-way: what is unfinished is redelivered.
            raise
        finally:
            elapsed = time.perf_counter() - started
            for event_type, outcome in counts:
                counted, timed = core.metrics_of(event_type, outcome)
                counted.inc()
                timed.observe(elapsed)
            if unfinished:
                counted, _ = core.metrics_of("unknown", "abandoned")
                counted.inc(len(unfinished))

    async def _unseen(self, claimed: list[_Claimed], finish: _Finish) -> list[_Claimed]:
        core = self.core
        processed = core.processed
        if processed is None or not claimed:
            return claimed
        keys = [item.key for item in claimed]
        seen = await core.retrying(lambda: processed.seen_all(keys))
        fresh: list[_Claimed] = []
        for item, was in zip(claimed, seen, strict=True):  # in fetch order
            if was:
                core.duplicates.inc()
                finish(item.record, item.inbound.envelope.type, "duplicate")
            else:
                fresh.append(item)
        return fresh

    async def _handle_fetch(self, items: list[_Claimed], finish: _Finish) -> list[_Claimed]:
        """Handle ``items`` together; those handled, the rest were dead-lettered (and
        finished). A failure a stop interrupted leaves every item unfinished."""
        core = self.core
        try:
            await self._handle_batch(items)
            return items
        except InvalidEvent:
            pass  # one of them is bad: find which below
        except Exception as exc:
            if core.stopping.is_set():
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
                await core.dead_letter(item.record, exc.to_error_info(), envelope.traceparent)
                finish(item.record, envelope.type, "dlq")
                continue
            except Exception as exc:
                if core.stopping.is_set():
                    raise asyncio.CancelledError from exc
                log.exception("giving up on event", extra={"event_type": envelope.type})
                await core.dead_letter(item.record, failure_info(exc), envelope.traceparent)
                finish(item.record, envelope.type, "dlq")
                continue
            done.append(item)
        return done

    async def _handle_batch(self, items: list[_Claimed]) -> None:
        core = self.core
        inbounds = [item.inbound for item in items]
        with batch_span(
            f"process {core.spec.service} batch",
            traceparents=[i.envelope.traceparent for i in inbounds],
            attributes={
                "messaging.batch.message_count": len(inbounds),
                "toolfleet.service": core.spec.service,
            },
        ):

            async def once() -> None:
                await core.producer.send_all(await self._handle(inbounds))

            await core.retrying(once)
