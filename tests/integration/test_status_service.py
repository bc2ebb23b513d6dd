"""The status service in-process against the real broker, Redis and Postgres."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import reduce

import asyncpg
import pytest
from redis.asyncio import Redis

from tests.support.eventually import eventually
from tests.support.lifecycle import T0, Lifecycle
from tests.support.pipeline import running_services
from toolfleet.auth.outcomes import OutcomeSigner
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.events.codec import ContentMode
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import InvocationStatus
from toolfleet.events.types import TOPIC_OF_TYPE, EventType, topic
from toolfleet.settings import FleetSettings
from toolfleet.status.projection import InvocationRow, apply, fact_of
from toolfleet.status.service import ProjectInput
from toolfleet.status.store import PostgresProjection

pytestmark = pytest.mark.integration

S = InvocationStatus


@dataclass
class StatusFleet:
    settings: FleetSettings
    producer: EventProducer
    pool: asyncpg.Pool
    redis: Redis
    group: str

    @property
    def store(self) -> PostgresProjection:
        return PostgresProjection(self.pool)

    async def publish(self, env: Envelope, mode: ContentMode = ContentMode.BINARY) -> None:
        name = TOPIC_OF_TYPE[EventType(env.type)]
        await self.producer.send(
            Outbound(envelope=env, topic=topic(self.settings.topic_prefix, name), mode=mode)
        )

    async def row_where(self, invocation_id: str, check: object) -> InvocationRow:
        async def ready() -> InvocationRow | None:
            row = await self.store.get(invocation_id)
            return row if row is not None and check(row) else None  # type: ignore[operator]

        return await eventually(ready, timeout=30)

    async def all_projected(self, events: list[Envelope]) -> InvocationRow:
        """The row once every one of ``events`` has been projected."""

        async def done() -> bool:
            count: int = await self.pool.fetchval(
                "SELECT count(*) FROM projected_events WHERE event_id = ANY($1::text[])",
                [e.id for e in events],
            )
            return count == len({(e.source, e.id) for e in events})

        await eventually(done, timeout=30)
        row = await self.store.get(events[0].invocationid or "")
        assert row is not None
        return row

    async def projections_of(self, env: Envelope) -> int:
        count: int = await self.pool.fetchval(
            "SELECT count(*) FROM projected_events WHERE source = $1 AND event_id = $2",
            env.source,
            env.id,
        )
        return count


@pytest.fixture(scope="module")
async def fleet(settings: FleetSettings) -> AsyncIterator[StatusFleet]:
    local = settings.model_copy(
        update={"topic_prefix": f"{settings.topic_prefix}st{uuid.uuid4().hex[:6]}."}
    )
    async with running_services(local, ["status"]) as (res,):
        # Plays the services that end calls: their outcomes are signed.
        producer = EventProducer(local, before_send=OutcomeSigner.from_settings(local).seal)
        await producer.start()
        try:
            yield StatusFleet(
                settings=local,
                producer=producer,
                pool=res.pool,
                redis=res.redis,
                group=res.group("status"),
            )
        finally:
            await producer.stop()


async def test_success_lifecycle(fleet: StatusFleet) -> None:
    lc = Lifecycle(parameters={"message": "hi", "api_key": "sk-123", "to": "bob@example.com"})
    modes = [ContentMode.BINARY, ContentMode.STRUCTURED]
    events = [
        lc.requested(),
        lc.authorized(),
        lc.invoked(),
        lc.checkpoint(40, "fetching"),
        lc.executed(),
        lc.outcome(S.SUCCESS),
    ]
    for i, env in enumerate(events):
        await fleet.publish(env, modes[i % 2])
    row = await fleet.all_projected(events)
    assert row.status is S.SUCCESS
    assert row.progress_percent == 100
    assert row.current_phase == "completed"
    assert row.result == {"message": "hi", "length": 2}
    assert row.parameters == {"message": "hi", "api_key": "[REDACTED]", "to": "[REDACTED:email]"}
    assert row.tool_version == "1.0.0"
    assert row.requested_version == "^1.0.0"
    assert row.tenant_id == lc.tenant
    assert row.agent_did == lc.agent
    assert row.latest_checkpoint is not None
    assert row.latest_checkpoint.checkpoint_id == "cp-40"
    assert row.created_at == T0
    rank = await fleet.pool.fetchval(
        "SELECT status_rank FROM tool_invocations WHERE invocation_id = $1",
        uuid.UUID(lc.invocation_id),
    )
    assert rank == 3


async def test_failure_lifecycle(fleet: StatusFleet) -> None:
    lc = Lifecycle()
    events = [lc.requested(), lc.authorized(), lc.invoked(), lc.outcome(S.ERROR)]
    for env in events:
        await fleet.publish(env)
    row = await fleet.all_projected(events)
    assert row.status is S.ERROR
    assert row.error is not None
    assert row.error["code"] == "tool_execution_error"
    assert row.result is None
    assert row.progress_percent == 0


async def test_out_of_order_terminal_first(fleet: StatusFleet) -> None:
    lc = Lifecycle()
    await fleet.publish(lc.outcome(S.SUCCESS), ContentMode.STRUCTURED)
    await fleet.row_where(lc.invocation_id, lambda r: r.status is S.SUCCESS)
    await fleet.publish(lc.invoked(at=2))
    await fleet.publish(lc.requested(at=0), ContentMode.STRUCTURED)
    row = await fleet.row_where(
        lc.invocation_id, lambda r: r.parameters is not None and r.started_at is not None
    )
    assert row.status is S.SUCCESS
    assert row.current_phase == "completed"
    assert row.progress_percent == 100
    assert row.created_at == T0
    assert row.started_at == T0 + timedelta(seconds=2)


async def test_duplicates_are_projected_once(fleet: StatusFleet) -> None:
    lc = Lifecycle()
    requested, checkpoint = lc.requested(), lc.checkpoint(30, "a")
    await fleet.publish(requested)
    await fleet.publish(requested, ContentMode.STRUCTURED)
    await fleet.publish(checkpoint)
    row = await fleet.all_projected([requested, checkpoint])
    assert row.progress_percent == 30
    assert await fleet.projections_of(requested) == 1
    # Status keeps no Redis markers: Postgres alone says no to a redelivery, even one
    # that arrives after newer events of the same invocation.
    await fleet.publish(checkpoint)
    later = lc.checkpoint(35, "b", at=5)
    await fleet.publish(later)
    row = await fleet.all_projected([requested, checkpoint, later])
    assert row.progress_percent == 35
    assert row.current_phase == "b"
    assert await fleet.projections_of(checkpoint) == 1


async def test_store_serializes_one_invocations_events(fleet: StatusFleet) -> None:
    """Concurrent projections of one invocation converge on the pure fold."""
    lc = Lifecycle()
    events = [
        lc.requested(),
        lc.authorized(),
        lc.invoked(),
        *(lc.checkpoint(p, f"p{p}", at=3 + p / 100) for p in (10, 20, 30, 40, 50)),
        lc.executed(),
        lc.outcome(S.SUCCESS),
    ]
    facts = [fact_of(e, now=T0) for e in events]

    def call(env: Envelope, fact: object) -> ProjectInput:
        return ProjectInput(
            source=env.source,
            event_id=env.id,
            tenant_id=lc.tenant,
            invocation_id=lc.invocation_id,
            transition=lambda row: apply(row, fact),  # type: ignore[arg-type]
        )

    store = fleet.store
    results = await asyncio.gather(
        *(store.project(call(e, f)) for e, f in zip(events, facts, strict=True)),
        *(store.project(call(e, f)) for e, f in zip(events, facts, strict=True)),
    )
    assert sum(results) == len(events)  # every event once, every duplicate refused
    expected = reduce(apply, facts, None)  # type: ignore[arg-type]
    assert await store.get(lc.invocation_id) == expected


class CountingPool:
    """The fleet's pool, counting the connections taken: one per transaction."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.acquired = 0

    def acquire(self) -> object:
        self.acquired += 1
        return self.pool.acquire()


def _call(lc: Lifecycle, env: Envelope) -> ProjectInput:
    fact = fact_of(env, now=T0)
    assert fact is not None
    return ProjectInput(
        source=env.source,
        event_id=env.id,
        tenant_id=lc.tenant,
        invocation_id=lc.invocation_id,
        transition=lambda row: apply(row, fact),
    )


def _lifecycle_events(lc: Lifecycle) -> list[Envelope]:
    return [lc.requested(), lc.authorized(), lc.invoked(), lc.executed(), lc.outcome(S.SUCCESS)]


async def test_many_invocations_projected_at_once_share_transactions(fleet: StatusFleet) -> None:
    counting = CountingPool(fleet.pool)
    store = PostgresProjection(counting)  # type: ignore[arg-type]
    lifecycles = [Lifecycle() for _ in range(40)]
    events = {lc.invocation_id: _lifecycle_events(lc) for lc in lifecycles}
    calls = [_call(lc, e) for lc in lifecycles for e in events[lc.invocation_id]]

    results = await asyncio.gather(*(store.project(c) for c in calls))

    assert all(results)
    # 200 events, not 200 transactions: the calls made together were written together.
    assert counting.acquired < len(calls) / 10
    for lc in lifecycles:
        expected = reduce(apply, [fact_of(e, now=T0) for e in events[lc.invocation_id]], None)  # type: ignore[arg-type]
        assert await store.get(lc.invocation_id) == expected
        assert (await store.get(lc.invocation_id)).status is S.SUCCESS  # type: ignore[union-attr]


async def test_a_poison_event_fails_alone_and_its_batch_is_projected(fleet: StatusFleet) -> None:
    store = fleet.store
    good, bad = Lifecycle(), Lifecycle()
    good_calls = [_call(good, e) for e in _lifecycle_events(good)]
    poison_event = bad.requested()

    def explode(_: InvocationRow | None) -> InvocationRow | None:
        raise ValueError("a transition that cannot be applied")

    poison = ProjectInput(
        source=poison_event.source,
        event_id=poison_event.id,
        tenant_id=bad.tenant,
        invocation_id=bad.invocation_id,
        transition=explode,
    )
    results = await asyncio.gather(
        *(store.project(c) for c in good_calls[:2]),
        store.project(poison),
        *(store.project(c) for c in good_calls[2:]),
        return_exceptions=True,
    )

    assert isinstance(results[2], ValueError)
    assert results[:2] + results[3:] == [True] * len(good_calls)
    row = await store.get(good.invocation_id)
    assert row is not None
    assert row.status is S.SUCCESS
    # The poison's transaction was rolled back: its event can still be projected later.
    assert await store.get(bad.invocation_id) is None
    assert await fleet.projections_of(poison_event) == 0


async def test_a_call_named_by_another_spelling_of_its_uuid_is_one_row(fleet: StatusFleet) -> None:
    # The store is handed canonical ids by the projection; one spelled otherwise (upper
    # case, braces) still reads, locks and writes the canonical row, and an id that is
    # no UUID at all fails alone.
    store = fleet.store
    lc, stray = Lifecycle(), Lifecycle()
    events = _lifecycle_events(lc)
    calls = [_call(lc, e) for e in events]
    spelled = [
        replace(calls[1], invocation_id=lc.invocation_id.upper()),
        replace(calls[3], invocation_id="{" + lc.invocation_id + "}"),
    ]
    not_a_uuid = replace(_call(stray, stray.requested()), invocation_id="job-1")

    results = await asyncio.gather(
        store.project(calls[0]),
        *(store.project(c) for c in spelled),
        store.project(not_a_uuid),
        store.project(calls[2]),
        store.project(calls[4]),
        return_exceptions=True,
    )

    assert isinstance(results[3], ValueError)
    assert results[:3] + results[4:] == [True] * 5
    expected = reduce(apply, [fact_of(e, now=T0) for e in events], None)  # type: ignore[arg-type]
    assert await store.get(lc.invocation_id) == expected
    rows: int = await fleet.pool.fetchval(
        "SELECT count(*) FROM tool_invocations WHERE invocation_id = $1",
        uuid.UUID(lc.invocation_id),
    )
    assert rows == 1


async def test_an_unreachable_database_fails_every_call_with_a_connection_error() -> None:
    pool = await asyncpg.create_pool("postgresql://postgres@127.0.0.1:1/none", min_size=0)
    store = PostgresProjection(pool)
    lc = Lifecycle()
    try:
        results = await asyncio.gather(
            *(store.project(_call(lc, e)) for e in _lifecycle_events(lc)),
            return_exceptions=True,
        )
    finally:
        await pool.close()
    # OSError is what the consumer runtime waits out; no event was given up on.
    assert all(isinstance(r, OSError) for r in results), results


async def test_text_postgres_refuses_round_trips_through_every_kind_of_column(
    fleet: StatusFleet,
) -> None:
    # NUL and a lone surrogate (Postgres stores neither), and the store's escape character
    # (a request with a surrogate in an identifier is refused before it is projected).
    tricky = "nul\x00 escape\ue000 \ue0000000"
    lone = f"lone\ud800 {tricky}"
    lc = Lifecycle(parameters={"message": lone, lone: [lone]})
    env = lc.requested(
        agent_context={"agent_did": lc.agent, "tenant_id": lc.tenant, "session_id": tricky},
        execution_options={"priority": "high", "idempotency_key": tricky},
    )
    call = replace(_call(lc, env), source=f"/agents/{lone}", event_id=f"{lone}{uuid.uuid4()}")
    store = fleet.store

    assert await store.project(call) is True
    row = await store.get(lc.invocation_id)
    assert row is not None
    assert (row.session_id, row.idempotency_key) == (tricky, tricky)  # text columns
    assert row.parameters == {"message": lone, lone: [lone]}  # jsonb
    assert await store.project(call) is False  # its source and id were stored as sent
    stored_as = env.model_copy(update={"source": call.source, "id": call.event_id})
    assert await fleet.projections_of(stored_as) == 1
