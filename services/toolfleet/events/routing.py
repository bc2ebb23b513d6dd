"""Who reads and writes which topic: the one routing table (pure data, no I/O).

Each service's handler builds its :class:`~toolfleet.bus.runtime.ConsumerSpec` from its
:class:`Consumer` rows here (group id, topics, where a new group starts reading), and the
AsyncAPI document's ``operations`` are generated from the same rows
(``toolfleet.cli.schemas``), so the published contract cannot drift from what the
services subscribe to. Parties outside the fleet (producers and their clients, SIEM
connectors) appear too, for the document's sake; they have no consumer group of ours.

Rows name topics without the configurable prefix and group ids without it either:
:meth:`toolfleet.worker.Resources.spec` adds both.

**Executor pools.** A route with ``pools`` covers the topic of every executor pool too:
``invoke.authorized`` is the default pool's topic and ``invoke.authorized.<pool>`` each
other pool's (:func:`~toolfleet.events.types.pool_topic`). Policy sends a call on its
tool's pool's topic; an executor reads the topics of the pools it serves, in one
consumer group per pool (:func:`pool_group`); the observers read every pool's topic
(:func:`subscription_pattern`: a pattern subscription, so a pool's topic created after
they started is read from its beginning).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from toolfleet.events.types import (
    DEFAULT_POOL,
    LIFECYCLE_TOPICS,
    TOPIC_OF_TYPE,
    EventType,
    Source,
    TopicName,
    check_pool_name,
    pool_topics_pattern,
    topic,
)


def types_on(name: TopicName) -> tuple[EventType, ...]:
    """Every event type that travels on topic ``name``, in declaration order."""
    return tuple(t for t, topic in TOPIC_OF_TYPE.items() if topic is name)


TERMINAL: tuple[EventType, ...] = types_on(TopicName.RESULTS)
CONTROL: tuple[EventType, ...] = types_on(TopicName.CONTROL)
NOTIFICATIONS: tuple[EventType, ...] = types_on(TopicName.EVENTS)


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """One party's use of one topic: which of its event types, and what for."""

    topic: TopicName
    types: tuple[EventType, ...]
    """The event types used; empty for the structured topics (audit), whose one message
    stands for every lifecycle type."""
    summary: str
    """One sentence for the AsyncAPI operation."""
    pools: bool = False
    """The route covers the topics of the executor pools too (``<topic>.<pool>``): only
    ``invoke.authorized`` has them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Consumer:
    """One consumer group of a service: what it reads and how it joins."""

    name: str
    """Metrics label and log field of the consumer (``ConsumerSpec.service``)."""
    group: str
    """Consumer group id without the topic prefix."""
    reads: tuple[Route, ...]
    per_worker: bool = False
    """Every worker joins its own group (``{group}-{worker_id}``), so each sees every
    record instead of a share of the partitions."""
    from_latest: bool = False
    """A new group starts at the end of its topics instead of the beginning."""
    all_pools: bool = False
    """It reads every executor pool's topic besides its own topics, those created after
    it started included (observers): see :func:`subscription_pattern`."""

    @property
    def topics(self) -> tuple[TopicName, ...]:
        return tuple(route.topic for route in self.reads)

    @property
    def auto_offset_reset(self) -> str:
        return "latest" if self.from_latest else "earliest"


@dataclass(frozen=True, slots=True, kw_only=True)
class Party:
    """A service of the fleet, or a party outside it, with everything it reads and writes."""

    name: str
    source: Source | None = None
    """``source`` of the events it emits; None outside the fleet."""
    consumers: tuple[Consumer, ...] = ()
    receives: tuple[Route, ...] = ()
    """What it reads without a consumer group of ours (parties outside the fleet)."""
    sends: tuple[Route, ...] = ()
    dead_letters: bool = False
    """Its consumers write what they cannot decode or process to the DLQ topic."""

    @property
    def reads(self) -> tuple[Route, ...]:
        return tuple(r for c in self.consumers for r in c.reads) + self.receives


def _observer(name: str, purpose: str) -> Consumer:
    """A consumer of every lifecycle topic, every type on each, every pool's topic too."""
    return Consumer(
        name=name,
        group=name,
        all_pools=True,
        reads=tuple(
            Route(
                topic=name,
                types=types_on(name),
                summary=purpose,
                pools=name is TopicName.AUTHORIZED,
            )
            for name in LIFECYCLE_TOPICS
        ),
    )


POLICY_CONSUMER = Consumer(
    name="policy",
    group="policy",
    reads=(
        Route(
            topic=TopicName.REQUESTED,
            types=(EventType.INVOKE_REQUESTED,),
            summary="Verifies the token, applies policy, resolves the version.",
        ),
        Route(
            topic=TopicName.CONTROL,
            types=CONTROL,
            summary="Resolves pending approvals and cancels waiting calls.",
        ),
    ),
)
POLICY_OUTCOMES = Consumer(
    name="policy-outcomes",
    group="policy-outcomes",
    reads=(
        Route(
            topic=TopicName.RESULTS,
            types=TERMINAL,
            summary="Answers duplicate requests that waited for the first one's outcome.",
        ),
    ),
)
EXECUTOR_RUNS = Consumer(
    name="executor",
    group="executor",
    reads=(
        Route(
            topic=TopicName.AUTHORIZED,
            types=(EventType.INVOKE_AUTHORIZED,),
            summary="Runs the tool: the topics of the pools it serves (--pool), one "
            "consumer group per pool.",
            pools=True,
        ),
    ),
)
EXECUTOR_CANCELS = Consumer(
    name="executor-control",
    group="executor-control",
    per_worker=True,
    from_latest=True,
    reads=(
        Route(
            topic=TopicName.CONTROL,
            types=(EventType.CANCEL_REQUESTED,),
            summary="Every executor instance sees every cancellation.",
        ),
    ),
)
VALIDATOR_CONSUMER = Consumer(
    name="validator",
    group="validator",
    reads=(
        Route(
            topic=TopicName.EXECUTED,
            types=(EventType.INVOKE_EXECUTED,),
            summary="Validates results against the output schema and redacts them.",
        ),
    ),
)
AUDIT_CONSUMER = _observer("audit", "Turns every lifecycle event into an audit event.")
STATUS_CONSUMER = _observer("status", "Projects every lifecycle event into the status API's store.")

PRODUCER = Party(
    name="producer",
    receives=(
        Route(
            topic=TopicName.RESULTS, types=TERMINAL, summary="Clients that wait read their outcome."
        ),
        Route(
            topic=TopicName.EVENTS,
            types=NOTIFICATIONS,
            summary="Clients that wait follow progress.",
        ),
    ),
    sends=(
        Route(
            topic=TopicName.REQUESTED,
            types=(EventType.INVOKE_REQUESTED,),
            summary="Producers (SDK, CLI, HTTP API) publish invoke requests.",
        ),
        Route(
            topic=TopicName.CONTROL,
            types=CONTROL,
            summary="Producers cancel invocations and approve or deny them.",
        ),
        Route(
            topic=TopicName.EVENTS,
            types=(EventType.TOOL_LIFECYCLE_CHANGED,),
            summary="The HTTP API announces an operator's registry lifecycle change.",
        ),
    ),
)
POLICY = Party(
    name="policy",
    source=Source.POLICY,
    consumers=(POLICY_CONSUMER, POLICY_OUTCOMES),
    sends=(
        Route(
            topic=TopicName.AUTHORIZED,
            types=(EventType.INVOKE_AUTHORIZED,),
            summary="Allowed requests, on the topic of the tool's pool.",
            pools=True,
        ),
        Route(
            topic=TopicName.RESULTS,
            types=TERMINAL,
            summary="Denied, invalid or cancelled requests end here.",
        ),
        Route(
            topic=TopicName.EVENTS,
            types=(
                EventType.INVOKE_QUEUED,
                EventType.APPROVAL_REQUESTED,
                EventType.CONTROL_REFUSED,
                EventType.OUTCOME_REFUSED,
            ),
            summary="Calls queued for a pool with no live executor; calls that need a "
            "human's approval; control events refused (unsigned or forged); outcomes "
            "duplicates waited on refused (unsigned or forged).",
        ),
    ),
    dead_letters=True,
)
EXECUTOR = Party(
    name="executor",
    source=Source.EXECUTOR,
    consumers=(EXECUTOR_RUNS, EXECUTOR_CANCELS),
    sends=(
        Route(
            topic=TopicName.AUTHORIZED,
            types=(EventType.INVOKE_AUTHORIZED,),
            summary="Hands a call whose tool it lacks (a misconfigured pool) to a partition "
            "of an executor of the pool that has the tool, policy's grant unchanged.",
            pools=True,
        ),
        Route(
            topic=TopicName.EXECUTED,
            types=(EventType.INVOKE_EXECUTED,),
            summary="Raw tool results.",
        ),
        Route(
            topic=TopicName.RESULTS,
            types=TERMINAL,
            summary="Tool errors, timeouts and cancellations end here.",
        ),
        Route(
            topic=TopicName.EVENTS,
            types=(
                EventType.INVOKE_QUEUED,
                EventType.INVOKED,
                EventType.CHECKPOINT_CREATED,
                EventType.CIRCUIT_OPENED,
                EventType.CIRCUIT_CLOSED,
                EventType.SOURCE_TOOL_ADDED,
                EventType.EGRESS,
            ),
            summary="Calls queued because no live executor of their pool has their tool, "
            "execution started, checkpoints, circuit changes, tools a source added at "
            "run time and sandbox egress.",
        ),
    ),
    dead_letters=True,
)
VALIDATOR = Party(
    name="validator",
    source=Source.VALIDATOR,
    consumers=(VALIDATOR_CONSUMER,),
    sends=(
        Route(topic=TopicName.RESULTS, types=TERMINAL, summary="Validated, redacted outcomes."),
    ),
    dead_letters=True,
)
AUDIT = Party(
    name="audit",
    source=Source.AUDIT,
    consumers=(AUDIT_CONSUMER,),
    sends=(
        Route(topic=TopicName.AUDIT, types=(), summary="Audit events (structured content mode)."),
    ),
    dead_letters=True,
)
STATUS = Party(
    name="status",
    source=Source.STATUS,
    consumers=(STATUS_CONSUMER,),
    sends=(
        Route(
            topic=TopicName.EVENTS,
            types=(EventType.OUTCOME_REFUSED,),
            summary="Outcomes refused (unsigned or forged): nothing is projected for them.",
        ),
    ),
    dead_letters=True,
)
SIEM = Party(
    name="siem",
    receives=(
        Route(
            topic=TopicName.AUDIT,
            types=(),
            summary="SIEM connectors read audit events from the value alone.",
        ),
    ),
)

ANALYTICS = Party(
    name="analytics",
    source=Source.ANALYTICS,
    receives=(
        Route(
            topic=TopicName.AUDIT,
            types=(),
            summary="Windowed tables per tenant and tool (a faust-streaming app).",
        ),
    ),
    sends=(
        Route(
            topic=TopicName.AUDIT,
            types=(EventType.ANOMALY,),
            summary="Anomalies the detectors found, for SIEMs (structured content mode).",
        ),
    ),
)

#: Every party, producers first, then the pipeline in order, then readers outside it.
ROUTING: tuple[Party, ...] = (
    PRODUCER,
    POLICY,
    EXECUTOR,
    VALIDATOR,
    AUDIT,
    STATUS,
    ANALYTICS,
    SIEM,
)

#: What a consumer writes for a record it cannot decode or process.
DEAD_LETTER = Route(
    topic=TopicName.DLQ,
    types=(EventType.DLQ_RECORD,),
    summary="Messages this consumer could not decode or process.",
)


def party_of(consumer: Consumer) -> Party:
    """The party whose consumer ``consumer`` is.

    Raises:
        LookupError: ``consumer`` is not a row of :data:`ROUTING`.
    """
    for party in ROUTING:
        if consumer in party.consumers:
            return party
    raise LookupError(f"consumer {consumer.name!r} is not in the routing table")


def pool_group(group: str, pool: str) -> str:
    """The consumer group of ``group``'s consumers of ``pool``'s topic: ``group`` itself
    for the default pool (unchanged), ``<group>.<pool>`` for another one. One group per
    pool: an executor joining or leaving one pool never rebalances another."""
    return group if check_pool_name(pool) == DEFAULT_POOL else f"{group}.{pool}"


def subscription_pattern(consumer: Consumer, prefix: str) -> str | None:
    """The pattern a consumer that reads every pool's topic (:attr:`Consumer.all_pools`)
    subscribes with: its own topics, and ``invoke.authorized.<pool>`` for any pool. None
    for every other consumer (it subscribes to its topics by name)."""
    if not consumer.all_pools:
        return None
    names = "|".join(re.escape(topic(prefix, name)) for name in consumer.topics)
    return f"^(?:{names}|{pool_topics_pattern(prefix)})$"
