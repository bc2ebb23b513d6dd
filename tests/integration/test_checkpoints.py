"""Hot and cold checkpoints against the real Redis and Postgres, and through the pipeline.

Kinds (micro, macro, named), delta encoding and compression of durable rows, the
fallback to Postgres when Redis lost the hot copy, ``resume_from_checkpoint_id``, and
fencing of both tiers with the lease epoch.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.errors import CheckpointFailed
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.identity import CallKey
from toolfleet.events.models import (
    AgentContext,
    CheckpointConfig,
    Effect,
    InvocationStatus,
    InvokeAuthorized,
    InvokeRequested,
    ToolOutcome,
)
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.executor.checkpoints.codec import canonical_json
from toolfleet.executor.checkpoints.cold import PostgresCheckpointStore
from toolfleet.executor.checkpoints.sink import CheckpointSink
from toolfleet.executor.checkpoints.store import (
    Checkpoint,
    RedisCheckpointStore,
    TieredCheckpointStore,
    checkpoint_key,
)
from toolfleet.executor.leasing.fencing import Fence, StaleLease, epoch_key, lease_key, runs_key
from toolfleet.executor.leasing.leases import RedisLeases, Taken
from toolfleet.secrets.capability import LeakDetector
from toolfleet.settings import FleetSettings
from toolfleet.storage.cancel_flags import MemoryCancelFlags
from toolfleet.storage.postgres import create_pool
from toolfleet.tools.context import ToolContext

pytestmark = pytest.mark.integration

AGENT = "did:agent:checkpoints"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    created = await create_pool(database_url, max_size=4)
    try:
        yield created
    finally:
        await created.close()


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("checkpoints")
    async with in_process_fleet(fleet_settings(settings, home)) as running:
        yield running


def checkpoint(
    invocation_id: str,
    state: dict[str, Any],
    *,
    kind: str = "macro",
    tenant: str = "t1",
    name: str | None = None,
) -> Checkpoint:
    return Checkpoint.model_validate(
        {
            "checkpoint_id": uuid.uuid4().hex,
            "invocation_id": invocation_id,
            "tenant_id": tenant,
            "checkpoint_type": kind,
            "name": name,
            "state": state,
            "progress_percent": 10,
            "current_phase": "test",
            "timestamp": datetime.now(UTC),
        }
    )


def big_state(step: int, rows: int = 300) -> dict[str, Any]:
    data: list[Any] = [{"n": i, "text": f"row {i} " * 4} for i in range(rows)]
    data[step % rows] = {"n": step, "text": None, "touched": [step, None]}
    state: dict[str, Any] = {"step": step, "rows": data, "nothing": None}
    if step % 2:
        state["odd"] = {"deep": {"step": step}}  # and removed again at the next step
    return state


def k(invocation_id: str, tenant: str = "t1") -> CallKey:
    """The call the tests' checkpoints belong to (``checkpoint()``'s default tenant)."""
    return CallKey(tenant_id=tenant, invocation_id=invocation_id)


async def rows_of(pool: asyncpg.Pool, invocation_id: str) -> list[asyncpg.Record]:
    return list(
        await pool.fetch(
            """SELECT checkpoint_id, checkpoint_type, name, parent_checkpoint_id, encoding,
                      size_bytes, octet_length(state) AS stored, lease_epoch
               FROM tool_checkpoints WHERE invocation_id = $1 ORDER BY created_at""",
            uuid.UUID(invocation_id),
        )
    )


async def invoke(
    fleet: Fleet,
    params: dict[str, Any],
    *,
    invocation_id: str | None = None,
    tenant: str = "t1",
    **checkpoint_config: Any,
) -> ToolOutcome:
    request = InvokeRequested(
        invocation_id=uuid.UUID(invocation_id) if invocation_id else uuid.uuid4(),
        tool_id="test__checkpointer",
        agent_context=AgentContext(agent_did=AGENT, tenant_id=tenant),
        parameters=params,
        capability_token=fleet.token(tenant, AGENT),
        checkpoint_config=CheckpointConfig(**checkpoint_config),
    )
    handle = await fleet.client.publish(request)
    return await fleet.client.wait(handle, timeout=30)


# --- the durable tier ------------------------------------------------------------------


async def test_big_states_are_compressed_deltas_in_bounded_chains(pool: asyncpg.Pool) -> None:
    store = PostgresCheckpointStore(pool, delta_min_bytes=4096, compress_min_bytes=1024)
    inv = str(uuid.uuid4())
    saved = [checkpoint(inv, big_state(step)) for step in range(12)]
    for cp in saved:
        await store.save(cp)

    rows = await rows_of(pool, inv)
    assert [r["checkpoint_id"] for r in rows] == [cp.checkpoint_id for cp in saved]
    assert [r["parent_checkpoint_id"] for r in rows] == [None] + [
        cp.checkpoint_id for cp in saved[:-1]
    ]
    # A full snapshot, nine deltas, a full snapshot again: a read decodes at most 10 rows.
    assert [r["encoding"].split("+")[0] for r in rows] == ["json"] + ["delta"] * 9 + [
        "json",
        "delta",
    ]
    assert rows[0]["encoding"] == "json+zlib"
    assert all(r["size_bytes"] == r["stored"] for r in rows)
    assert rows[1]["size_bytes"] < len(canonical_json(saved[1].state)) / 20

    fresh = PostgresCheckpointStore(pool)  # no cached parent: everything from the rows
    for cp in saved:
        read = await fresh.get(cp.checkpoint_id)
        assert read is not None
        assert canonical_json(read.state) == canonical_json(cp.state)
        assert (read.invocation_id, read.tenant_id, read.checkpoint_type) == (inv, "t1", "macro")
    latest = await fresh.latest(k(inv))
    assert latest is not None
    assert latest.checkpoint_id == saved[-1].checkpoint_id
    assert await fresh.get("no-such-checkpoint") is None
    assert await fresh.latest(k(str(uuid.uuid4()))) is None
    assert await fresh.latest(k("not-a-uuid")) is None


async def test_a_takeover_worker_chains_onto_the_rows_of_the_last(pool: asyncpg.Pool) -> None:
    inv = str(uuid.uuid4())
    first, second = checkpoint(inv, big_state(1)), checkpoint(inv, big_state(2), kind="named")
    await PostgresCheckpointStore(pool).save(first)
    await PostgresCheckpointStore(pool).save(second, fence=Fence(k(inv), 2))
    rows = await rows_of(pool, inv)
    assert [r["parent_checkpoint_id"] for r in rows] == [None, first.checkpoint_id]
    assert [r["encoding"] for r in rows] == ["json+zlib", "delta"]
    assert [r["checkpoint_type"] for r in rows] == ["macro", "named"]
    assert [r["lease_epoch"] for r in rows] == [None, 2]
    read = await PostgresCheckpointStore(pool).get(second.checkpoint_id)
    assert read is not None
    assert read.state == second.state


async def test_small_states_are_plain_json(pool: asyncpg.Pool) -> None:
    store = PostgresCheckpointStore(pool)
    inv = str(uuid.uuid4())
    for step in range(3):
        await store.save(checkpoint(inv, {"step": step, "none": None}))
    assert [r["encoding"] for r in await rows_of(pool, inv)] == ["json"] * 3


async def test_runs_starting_together_each_find_their_own_newest_checkpoint(
    pool: asyncpg.Pool,
) -> None:
    store = PostgresCheckpointStore(pool)
    with_rows = [str(uuid.uuid4()) for _ in range(3)]
    for i, inv in enumerate(with_rows):
        for step in range(i + 1):
            await store.save(checkpoint(inv, {"inv": i, "step": step}))
    never = [str(uuid.uuid4()) for _ in range(20)]
    asked = [*never[:10], *with_rows, *never[10:], with_rows[0], "not-a-uuid"]
    found = await asyncio.gather(*(PostgresCheckpointStore(pool).latest(k(i)) for i in asked))
    shared = PostgresCheckpointStore(pool)  # one store: the lookups share one query
    found_shared = await asyncio.gather(*(shared.latest(k(i)) for i in asked))
    for answers in (found, found_shared):
        by_id = dict(zip(asked, answers, strict=True))
        assert all(by_id[inv] is None for inv in [*never, "not-a-uuid"])
        for i, inv in enumerate(with_rows):
            newest = by_id[inv]
            assert newest is not None
            assert newest.invocation_id == inv
            assert newest.state == {"inv": i, "step": i}


# --- tiers and the fallback ------------------------------------------------------------


async def test_hot_first_then_postgres_when_redis_lost_it(redis: Redis, pool: asyncpg.Pool) -> None:
    store = TieredCheckpointStore(
        hot=RedisCheckpointStore(redis), cold=PostgresCheckpointStore(pool)
    )
    inv = str(uuid.uuid4())
    macro = checkpoint(inv, {"step": 1})
    micro = checkpoint(inv, {"step": 2}, kind="micro")
    await store.save(macro)
    await store.save(micro)
    assert [r["checkpoint_id"] for r in await rows_of(pool, inv)] == [macro.checkpoint_id]
    hot = await store.latest(k(inv))
    assert hot is not None
    assert (hot.checkpoint_id, hot.checkpoint_type, hot.state) == (
        micro.checkpoint_id,
        "micro",
        {"step": 2},
    )

    await redis.delete(checkpoint_key(k(inv)))  # Redis restarted, or the TTL ran out
    cold = await store.latest(k(inv))
    assert cold is not None
    assert (cold.checkpoint_id, cold.state, cold.tenant_id) == (
        macro.checkpoint_id,
        {"step": 1},
        "t1",
    )


async def test_the_pipeline_resumes_from_postgres_when_the_hot_copy_is_gone(
    fleet: Fleet, pool: asyncpg.Pool, redis: Redis
) -> None:
    inv = str(uuid.uuid4())
    durable = checkpoint(inv, {"step": 2, "marker": "from postgres", "rows": []})
    await PostgresCheckpointStore(pool).save(durable)
    assert not await redis.exists(checkpoint_key(k(inv)))

    outcome = await invoke(fleet, {"steps": 4}, invocation_id=inv)
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.result is not None
    assert outcome.result["resumed_step"] == 2
    assert outcome.result["resumed_marker"] == "from postgres"
    assert outcome.execution_metadata.resumed_from_checkpoint_id == durable.checkpoint_id


# --- kinds through the pipeline --------------------------------------------------------


async def test_kinds_are_reported_and_durable_ones_chained(
    fleet: Fleet, pool: asyncpg.Pool, redis: Redis
) -> None:
    inv = str(uuid.uuid4())
    outcome = await invoke(fleet, {"steps": 4, "names": {"3": "half"}}, invocation_id=inv)
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    refs = outcome.execution_metadata.checkpoints_created
    assert [r.checkpoint_type for r in refs] == ["macro", "micro", "named", "micro"]
    assert outcome.result is not None
    assert [r.checkpoint_id for r in refs] == outcome.result["checkpoint_ids"]

    events = [
        e
        for e in await fleet.read(TopicName.EVENTS, invocation_id=inv)
        if e.type == EventType.CHECKPOINT_CREATED
    ]
    assert [(e.data["checkpoint_id"], e.data["checkpoint_type"]) for e in events] == [
        (r.checkpoint_id, r.checkpoint_type) for r in refs
    ]

    rows = await rows_of(pool, inv)
    assert [(r["checkpoint_id"], r["checkpoint_type"], r["name"]) for r in rows] == [
        (refs[0].checkpoint_id, "macro", None),
        (refs[2].checkpoint_id, "named", "half"),
    ]
    assert [r["parent_checkpoint_id"] for r in rows] == [None, refs[0].checkpoint_id]
    hot = await RedisCheckpointStore(redis).latest(k(inv))
    assert hot is not None
    assert (hot.checkpoint_id, hot.checkpoint_type, hot.state["step"]) == (
        refs[3].checkpoint_id,
        "micro",
        4,
    )


async def test_interval_zero_keeps_every_checkpoint_as_deltas(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    inv = str(uuid.uuid4())
    outcome = await invoke(
        fleet, {"steps": 5, "rows": 300}, invocation_id=inv, checkpoint_interval_seconds=0
    )
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    refs = outcome.execution_metadata.checkpoints_created
    assert [r.checkpoint_type for r in refs] == ["macro"] * 5
    rows = await rows_of(pool, inv)
    assert [r["encoding"] for r in rows] == ["json+zlib"] + ["delta"] * 4
    store = PostgresCheckpointStore(pool)
    for step, ref in enumerate(refs, start=1):
        read = await store.get(ref.checkpoint_id)
        assert read is not None
        assert read.state["step"] == step
        assert read.state["rows"][step]["text"] == f"step {step}"


# --- resume_from_checkpoint_id ---------------------------------------------------------


async def test_resume_from_a_named_checkpoint_not_the_latest(
    fleet: Fleet, pool: asyncpg.Pool, redis: Redis
) -> None:
    inv = str(uuid.uuid4())
    tiered = TieredCheckpointStore(
        hot=RedisCheckpointStore(redis), cold=PostgresCheckpointStore(pool)
    )
    named = checkpoint(inv, {"step": 1, "marker": "named", "rows": []}, kind="named", name="n")
    await tiered.save(named)
    await tiered.save(checkpoint(inv, {"step": 3, "marker": "macro", "rows": []}))
    await tiered.save(checkpoint(inv, {"step": 4, "marker": "hot", "rows": []}, kind="micro"))

    outcome = await invoke(
        fleet, {"steps": 5}, invocation_id=inv, resume_from_checkpoint_id=named.checkpoint_id
    )
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.result is not None
    assert (outcome.result["resumed_step"], outcome.result["resumed_marker"]) == (1, "named")
    assert len(outcome.result["checkpoint_ids"]) == 4  # steps 2 to 5 again
    assert outcome.execution_metadata.resumed_from_checkpoint_id == named.checkpoint_id


async def test_resume_from_the_hot_checkpoint_by_id(fleet: Fleet, redis: Redis) -> None:
    inv = str(uuid.uuid4())
    hot = checkpoint(inv, {"step": 2, "marker": "hot only", "rows": []}, kind="micro")
    await RedisCheckpointStore(redis).save(hot)
    outcome = await invoke(
        fleet, {"steps": 3}, invocation_id=inv, resume_from_checkpoint_id=hot.checkpoint_id
    )
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.result is not None
    assert outcome.result["resumed_marker"] == "hot only"


@pytest.mark.parametrize("whose", ["unknown", "another invocation", "another tenant"])
async def test_a_checkpoint_not_of_this_invocation_is_resume_failed(
    fleet: Fleet, pool: asyncpg.Pool, whose: str
) -> None:
    inv = str(uuid.uuid4())
    store = PostgresCheckpointStore(pool)
    target = "no-such-checkpoint"
    if whose == "another invocation":
        other = checkpoint(str(uuid.uuid4()), {"step": 1, "secret": "theirs", "rows": []})
        await store.save(other)
        target = other.checkpoint_id
    elif whose == "another tenant":
        other = checkpoint(inv, {"step": 1, "secret": "theirs", "rows": []}, tenant="t_other")
        await store.save(other)
        target = other.checkpoint_id

    outcome = await invoke(fleet, {"steps": 2}, invocation_id=inv, resume_from_checkpoint_id=target)
    assert outcome.status is InvocationStatus.ERROR
    assert outcome.error is not None
    assert outcome.error.code == "resume_failed"
    assert not outcome.error.retryable
    assert "theirs" not in outcome.model_dump_json()


async def test_another_tenants_latest_checkpoint_is_never_resumed(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    inv = str(uuid.uuid4())
    await PostgresCheckpointStore(pool).save(
        checkpoint(inv, {"step": 1, "marker": "theirs", "rows": []}, tenant="t_other")
    )
    outcome = await invoke(fleet, {"steps": 2}, invocation_id=inv)
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.result is not None
    assert outcome.result["resumed_step"] is None
    assert outcome.execution_metadata.resumed_from_checkpoint_id is None


# --- fencing ---------------------------------------------------------------------------


async def test_a_stale_epoch_cannot_write_the_hot_checkpoint(redis: Redis) -> None:
    store = RedisCheckpointStore(redis)
    inv = str(uuid.uuid4())
    await redis.set(epoch_key(k(inv)), 2)
    with pytest.raises(StaleLease) as refused:
        await store.save(checkpoint(inv, {"by": "zombie"}), fence=Fence(k(inv), 1))
    assert refused.value.fence == Fence(k(inv), 1)
    assert await store.latest(k(inv)) is None

    owner = checkpoint(inv, {"by": "owner"})
    await store.save(owner, fence=Fence(k(inv), 2))
    with pytest.raises(StaleLease):
        await store.save(checkpoint(inv, {"by": "zombie"}), fence=Fence(k(inv), 1))
    latest = await store.latest(k(inv))
    assert latest is not None
    assert latest.state == {"by": "owner"}
    assert int(await redis.ttl(checkpoint_key(k(inv)))) > 3500


async def test_after_redis_loses_the_epochs_postgres_still_fences_by_them(
    redis: Redis, pool: asyncpg.Pool
) -> None:
    leases = RedisLeases(redis, ttl_s=0.2)
    tiers = TieredCheckpointStore(
        hot=RedisCheckpointStore(redis), cold=PostgresCheckpointStore(pool)
    )
    inv = str(uuid.uuid4())
    first = await leases.acquire(k(inv), "first")
    await asyncio.sleep(0.3)
    zombie = await leases.acquire(k(inv), "zombie")  # took over, then froze
    assert isinstance(first, Taken)
    assert isinstance(zombie, Taken)
    await tiers.save(checkpoint(inv, {"by": "zombie"}), fence=zombie.fence)
    # Redis restarts empty: epochs, lease and hot checkpoint are gone; Postgres keeps rows.
    await redis.delete(
        epoch_key(k(inv)), lease_key(k(inv)), runs_key(k(inv)), checkpoint_key(k(inv))
    )
    await asyncio.sleep(0.01)
    owner = await leases.acquire(k(inv), "owner")
    assert isinstance(owner, Taken)
    # The new owner resumes from Postgres and its durable checkpoints are accepted ...
    resumed = await tiers.latest(k(inv))
    assert resumed is not None
    assert resumed.state == {"by": "zombie"}
    assert await tiers.save(checkpoint(inv, {"by": "owner"}), fence=owner.fence) == "macro"
    # ... while the zombie, waking up, is refused by both tiers.
    with pytest.raises(StaleLease):
        await tiers.save(checkpoint(inv, {"by": "zombie, late"}), fence=zombie.fence)
    with pytest.raises(StaleLease):
        await PostgresCheckpointStore(pool).save(
            checkpoint(inv, {"by": "zombie, late"}), fence=zombie.fence
        )
    latest = await tiers.latest(k(inv))
    assert latest is not None
    assert latest.state == {"by": "owner"}


async def test_a_stale_epoch_cannot_append_a_durable_checkpoint(pool: asyncpg.Pool) -> None:
    store = PostgresCheckpointStore(pool)
    inv = str(uuid.uuid4())
    await store.save(checkpoint(inv, {"by": "first"}), fence=Fence(k(inv), 1))
    await store.save(checkpoint(inv, {"by": "successor"}), fence=Fence(k(inv), 2))
    zombie = checkpoint(inv, {"by": "zombie"})
    with pytest.raises(StaleLease):
        await store.save(zombie, fence=Fence(k(inv), 1))
    rows = await rows_of(pool, inv)
    assert [r["lease_epoch"] for r in rows] == [1, 2]
    latest = await store.latest(k(inv))
    assert latest is not None
    assert latest.state == {"by": "successor"}


async def test_concurrent_fenced_writers_never_interleave(pool: asyncpg.Pool) -> None:
    inv = str(uuid.uuid4())
    stores = [PostgresCheckpointStore(pool) for _ in range(2)]

    async def write(epoch: int) -> bool:
        try:
            await stores[epoch % 2].save(
                checkpoint(inv, big_state(epoch)), fence=Fence(k(inv), epoch)
            )
        except StaleLease:
            return False
        return True

    written = await asyncio.gather(*(write(epoch) for epoch in range(1, 9)))
    rows = await rows_of(pool, inv)
    epochs = [r["lease_epoch"] for r in rows]
    assert epochs == sorted(epochs)  # never a row under an older epoch after a newer one
    assert len(rows) == sum(written)
    assert [r["parent_checkpoint_id"] for r in rows[1:]] == [r["checkpoint_id"] for r in rows[:-1]]


class _Emitter:
    def __init__(self) -> None:
        self.emitted: list[Envelope] = []

    async def emit(self, topic: TopicName, envelope: Envelope) -> Awaitable[object]:
        self.emitted.append(envelope)
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


async def test_stale_lease_propagates_out_of_ctx_checkpoint(
    redis: Redis, pool: asyncpg.Pool
) -> None:
    inv = uuid.uuid4()
    emitter = _Emitter()
    store = TieredCheckpointStore(
        hot=RedisCheckpointStore(redis), cold=PostgresCheckpointStore(pool)
    )
    call = InvokeAuthorized(
        invocation_id=inv,
        tool_id="test__checkpointer",
        tool_version="1.0.0",
        requested_version="*",
        agent_context=AgentContext(agent_did=AGENT, tenant_id="t1"),
        parameters={},
        effect=Effect.READ_ONLY,
        timeout_seconds=5,
        requested_at=datetime.now(UTC),
    )
    parent = new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data=call,
        tenant_id="t1",
        invocation_id=str(inv),
    )
    await redis.set(epoch_key(k(str(inv))), 1)
    sink = CheckpointSink(
        store=store,
        emitter=emitter,
        cancels=MemoryCancelFlags(),
        cancel_local=lambda: None,
        suspended=lambda: False,
        parent=parent,
        call=call,
        cancel_event=asyncio.Event(),
        leaks=LeakDetector(()),
        fence=Fence(k(str(inv)), 1),
    )
    ctx = ToolContext(
        tenant_id="t1",
        agent_did=AGENT,
        invocation_id=str(inv),
        tool_id=call.tool_id,
        tool_version=call.tool_version,
        checkpoints=sink,
    )
    assert await ctx.checkpoint({"step": 1}) is not None  # macro: both tiers, fenced
    await redis.set(epoch_key(k(str(inv))), 2)  # another worker took the call over
    with pytest.raises(StaleLease):
        await ctx.checkpoint({"step": 2})  # micro: the hot write is refused
    with pytest.raises(StaleLease):
        await ctx.checkpoint({"step": 3}, name="late")  # named: refused too
    assert len(emitter.emitted) == 1
    assert [r["lease_epoch"] for r in await rows_of(pool, str(inv))] == [1]


async def test_unreachable_stores_are_checkpoint_failed(database_url: str) -> None:
    dead_redis = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
    try:
        with pytest.raises(CheckpointFailed):
            await RedisCheckpointStore(dead_redis).save(checkpoint(str(uuid.uuid4()), {}))
    finally:
        await dead_redis.aclose()
    closed = await create_pool(database_url, min_size=0, max_size=1)
    await closed.close()
    with pytest.raises(CheckpointFailed):
        await PostgresCheckpointStore(closed).save(checkpoint(str(uuid.uuid4()), {}))


class _FlakyCold:
    """A durable tier that is down for its first ``failures`` writes."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.saved: list[Checkpoint] = []

    async def save(self, checkpoint: Checkpoint, *, fence: Fence | None = None) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise CheckpointFailed("checkpoint could not be saved: ConnectionRefusedError")
        self.saved.append(checkpoint)

    async def latest(self, call: CallKey) -> Checkpoint | None:
        return None

    async def get(self, checkpoint_id: str) -> Checkpoint | None:
        return None


async def test_a_postgres_blip_is_retried_then_a_macro_checkpoint_stays_hot(
    redis: Redis,
) -> None:
    hot = RedisCheckpointStore(redis)
    inv = str(uuid.uuid4())
    blip = _FlakyCold(failures=2)
    tiers = TieredCheckpointStore(hot=hot, cold=blip, cold_retry_delays_s=(0.01, 0.01))
    assert await tiers.save(checkpoint(inv, {"step": 1})) == "macro"  # third try stored it
    assert [c.state for c in blip.saved] == [{"step": 1}]

    down = _FlakyCold(failures=100)
    tiers = TieredCheckpointStore(
        hot=hot, cold=down, cold_retry_delays_s=(0.01,), named_patience_s=0.2
    )
    assert await tiers.save(checkpoint(inv, {"step": 2})) == "micro"  # kept hot, not failed
    latest = await hot.latest(k(inv))
    assert latest is not None
    assert latest.state == {"step": 2}
    with pytest.raises(CheckpointFailed):  # a named one was asked for: it must be durable
        await tiers.save(checkpoint(inv, {"step": 3}, kind="named", name="fetched"))


async def test_a_named_checkpoint_waits_out_a_postgres_blip(redis: Redis) -> None:
    inv = str(uuid.uuid4())
    blip = _FlakyCold(failures=4)  # more than a macro checkpoint's few tries
    tiers = TieredCheckpointStore(hot=RedisCheckpointStore(redis), cold=blip)
    named = checkpoint(inv, {"step": 1}, kind="named", name="fetched")
    assert await tiers.save(named) == "named"
    assert [c.name for c in blip.saved] == ["fetched"]


async def test_a_redis_that_stays_down_fails_the_checkpoint_after_the_patience() -> None:
    unreachable = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    tiers = TieredCheckpointStore(
        hot=RedisCheckpointStore(unreachable), cold=_FlakyCold(failures=0), hot_patience_s=0.5
    )
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(CheckpointFailed):
        await tiers.save(checkpoint(str(uuid.uuid4()), {"step": 1}, kind="micro"))
    assert loop.time() - began >= 0.5  # tried again until the patience ran out
    await unreachable.aclose()
