"""What a consumer reads and how it hands records over: the consumer's public vocabulary.

:class:`ConsumerSpec` declares a consumer, :class:`Inbound` is what a handler gets, and
the handler's kind picks how records reach it: a :data:`Handler` one record at a time
(with ``ConsumerSpec.schedule``, from a backlog), a :class:`ByBatch` a whole fetch at
once (:mod:`toolfleet.bus.consumer.modes`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import ConsumerRecord

from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.offsets import Partition
from toolfleet.bus.producer import Outbound
from toolfleet.bus.profile import FetchPacing, PacingInput
from toolfleet.bus.scheduler import Placement
from toolfleet.events.envelope import Envelope
from toolfleet.settings import FleetSettings

#: How often a pattern-subscribed consumer refreshes its metadata, so a topic created
#: after it started (a new executor pool's) is found within seconds, not aiokafka's 5 min.
PATTERN_METADATA_MAX_AGE_MS = 5_000


@dataclass(frozen=True, slots=True, kw_only=True)
class Inbound:
    """One decoded record handed to a service's handler."""

    envelope: Envelope
    topic: str
    partition: int
    offset: int
    key: bytes | None

    @classmethod
    def of(cls, record: ConsumerRecord[bytes, bytes], envelope: Envelope) -> Inbound:
        """``record`` as decoded into ``envelope``."""
        return cls(
            envelope=envelope,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=record.key,
        )


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


def pacing_input(spec: ConsumerSpec) -> PacingInput:
    """What a consumer of ``spec`` asks of its broker profile."""
    return PacingInput(
        topics=frozenset(spec.topics),
        fetch_max_wait_ms=spec.fetch_max_wait_ms,
        observer=spec.observer,
    )


FETCHER_IDLE_WAKE_MS = 2000
"""``consumer_timeout_ms`` of every consumer (see :func:`consumer_kwargs`)."""
MAX_POLL_INTERVAL_MS = 300_000
"""``max_poll_interval_ms`` of every consumer: a member that calls no ``getmany`` for this
long leaves its group."""
FULL_POLL_S = MAX_POLL_INTERVAL_MS / 1000 / 10
"""How long a consumer at its in-flight bound waits for room before it polls anyway, its
partitions paused, to stay in its group (:class:`toolfleet.bus.runtime.EventConsumer`)."""


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
        "max_poll_interval_ms": MAX_POLL_INTERVAL_MS,
        # How long aiokafka's fetch routine sleeps when it has no request out (every
        # partition paused, or resting under the dev profile) before it looks again: a
        # safety net, since resumed partitions, consumed records and new assignments
        # wake it at once. Its default, 200 ms, woke every idle consumer five times a second.
        "consumer_timeout_ms": FETCHER_IDLE_WAKE_MS,
        **(
            {"metadata_max_age_ms": PATTERN_METADATA_MAX_AGE_MS} if spec.pattern is not None else {}
        ),
    }
