"""The core every consumer mode shares: in-flight tasks, offsets, retries, DLQ, metrics.

A :class:`ConsumerCore` knows nothing of how records reach a handler: a :class:`Mode`
(:mod:`toolfleet.bus.consumer.modes`) turns fetched records into tasks through it, and
:class:`~toolfleet.bus.runtime.EventConsumer` owns the aiokafka consumer, its polling,
pacing and commits around both. A record counts as finished for commits
(:class:`~toolfleet.bus.offsets.OffsetTracker`) once its outputs are acknowledged or it
is dead-lettered; a cancelled one stays unfinished and is redelivered.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import TypeVar

import redis.exceptions
from aiokafka import ConsumerRecord
from aiokafka.errors import KafkaError
from prometheus_client import Counter, Histogram
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_random_exponential

from toolfleet.bus.consumer.spec import ConsumerSpec
from toolfleet.bus.dedupe import ProcessedEvents
from toolfleet.bus.dlq import dlq_message
from toolfleet.bus.offsets import OffsetTracker, Partition
from toolfleet.bus.producer import EventProducer
from toolfleet.errors import ErrorCode, ErrorInfo, InvalidEvent, ToolfleetError
from toolfleet.events.codec import decode
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import valid_traceparent, with_trace
from toolfleet.observability import metrics
from toolfleet.settings import FleetSettings
from toolfleet.storage.errors import POSTGRES_UNAVAILABLE
from toolfleet.storage.retrying import Backoff, retry_until_stopped

# Records are logged under the runtime's name, as they were before the modes split off.
log = logging.getLogger("toolfleet.bus.runtime")
T = TypeVar("T")

#: Retries (after the first attempt) of an unexpected, non-transient handler error
#: before the message is dead-lettered: three attempts in all.
_MAX_UNEXPECTED_ATTEMPTS = 2


@dataclass(slots=True)
class _Work:
    """What one task handles: the partitions of its records, and how many there are."""

    parts: frozenset[Partition]
    records: int


class ConsumerCore:
    """What every mode of one consumer shares (state of its run, and the services on it)."""

    def __init__(
        self,
        spec: ConsumerSpec,
        *,
        settings: FleetSettings,
        producer: EventProducer,
        processed: ProcessedEvents | None,
        dlq_topic: str,
    ) -> None:
        self.spec = spec
        self.settings = settings
        self.producer = producer
        self.processed = processed
        self.dlq_topic = dlq_topic
        self.finished = asyncio.Event()
        """Set when a record finishes: the commit loop waits for it rather than polling."""
        self.tracker = OffsetTracker(on_finish=self.finished.set)
        self.tasks: dict[asyncio.Task[None], _Work] = {}
        self.in_flight = 0
        """Records being handled (a batch task holds several)."""
        self.room_freed = asyncio.Event()
        """Set when a task ends (its records leave ``in_flight``): a consumer at its bound
        waits for it rather than polling."""
        self.in_flight_keys: set[str] = set()
        """Dedupe keys of the records being handled: a twin fetched meanwhile is skipped."""
        self.stopping = asyncio.Event()
        """Set once the consumer drains: retries end, failures are no longer dead-lettered."""
        self.stop_requested: asyncio.Event | None = None
        """The ``stop`` its run was given: queued records start no more once it is set."""
        # Metric children bound once: a ``labels()`` lookup per record was 6% of audit.
        self.duplicates = metrics.DUPLICATES_SKIPPED.labels(spec.service)
        self._per_type: dict[tuple[str, str], tuple[Counter, Histogram]] = {}

    # --- tasks -----------------------------------------------------------------------

    def track(
        self, work: Coroutine[None, None, None], parts: frozenset[Partition], records: int
    ) -> asyncio.Task[None]:
        """Run ``work`` as a task holding ``records`` records of ``parts``."""
        task = asyncio.create_task(work)
        self.tasks[task] = _Work(parts, records)
        self.in_flight += records
        task.add_done_callback(self._forget_task)
        return task

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        work = self.tasks.pop(task, None)
        if work is not None:
            self.in_flight -= work.records
            self.room_freed.set()
        if not task.cancelled() and task.exception() is not None:  # pragma: no cover
            log.error("record task crashed", exc_info=task.exception())

    def tasks_of(self, parts: set[Partition]) -> list[asyncio.Task[None]]:
        """The tasks handling a record of ``parts``."""
        return [task for task, work in self.tasks.items() if not work.parts.isdisjoint(parts)]

    async def drain(self, timeout_s: float) -> None:
        """Let in-flight tasks finish for ``timeout_s``, then cancel the rest."""
        if self.tasks:
            log.info("draining in-flight events", extra={"in_flight": len(self.tasks)})
            _, pending = await asyncio.wait(list(self.tasks), timeout=timeout_s)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

    # --- records ---------------------------------------------------------------------

    def decode(self, record: ConsumerRecord[bytes, bytes]) -> Envelope:
        """``record``'s envelope (with a trace); InvalidEvent when it is not one."""
        if record.value is not None and len(record.value) > self.settings.max_event_bytes:
            raise InvalidEvent(
                "message larger than the configured limit",
                details={"bytes": len(record.value), "limit": self.settings.max_event_bytes},
            )
        # Where a request without a trace gets one: every stage downstream inherits it.
        return with_trace(decode(key=record.key, value=record.value, headers=record.headers))

    def metrics_of(self, event_type: str, outcome: str) -> tuple[Counter, Histogram]:
        """The processed counter and the timing histogram of ``event_type``'s ``outcome``."""
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

    # --- retries and the DLQ ---------------------------------------------------------

    async def retrying(self, step: Callable[[], Awaitable[T]]) -> T:
        """Run ``step``; transient failures retry without limit, others a few times."""
        try:  # the fast path: no retry machinery unless something failed
            return await step()
        except InvalidEvent:
            raise
        except Exception as exc:
            if self.stopping.is_set():
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
        if self.stopping.is_set():
            return True
        exc = state.outcome.exception() if state.outcome else None
        if exc is not None and (is_transient(exc) or isinstance(exc, self.spec.extra_transient)):
            log.warning("transient failure, retrying", extra={"error": type(exc).__name__})
            return False
        return state.attempt_number >= _MAX_UNEXPECTED_ATTEMPTS

    async def dead_letter(
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

        async def publish() -> None:
            await await_ack(await self.producer.send_wire(self.dlq_topic, message))

        # Until it is acknowledged: the record is finished (committed past) only then.
        await retry_until_stopped(
            publish,
            what="dead-letter publish failed; retrying",
            backoff=Backoff(first_s=0.1, max_s=5.0),
            retry_on=(Exception,),
            log_extra={"topic": self.dlq_topic},
        )


class Mode(ABC):
    """How fetched records reach a consumer's handler (one of
    :mod:`toolfleet.bus.consumer.modes`), over the consumer's :class:`ConsumerCore`."""

    def __init__(self, core: ConsumerCore) -> None:
        self.core = core

    @property
    def queued(self) -> int:
        """Records fetched and waiting to start."""
        return 0

    def room(self) -> int:
        """Records the next fetch may bring (none when zero or less: the consumer pauses)."""
        return self.core.spec.max_in_flight - self.core.in_flight

    @abstractmethod
    def dispatch(self, records: Sequence[ConsumerRecord[bytes, bytes]]) -> None:
        """Take the records of one fetch (in fetch order, partition by partition)."""

    def before_release(self, revoked: set[Partition]) -> None:
        """Told first when ``revoked`` partitions go (before their tasks are waited for);
        a mode that holds no records of its own has nothing to give back."""
        return


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is infrastructure trouble, retried without limit."""
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


def failure_info(exc: Exception) -> ErrorInfo:
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
