"""Executor pools' state in the real Redis and Postgres: presence with its TTL, the
queued-call index and its atomic claim, the registry's pool (restated on re-registration)
and ``pools_in_use``, and migration 0012 on a database that already holds tools and calls."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest

from tests.support.databases import database_before
from tests.support.eventually import eventually
from tests.support.lifecycle import Lifecycle
from toolfleet.contract.manifest import LifecycleState, ToolManifest
from toolfleet.events.models import Effect, InvokeAuthorized
from toolfleet.registry.lookup import ToolLookup
from toolfleet.registry.store import LifecycleChange, RegistryStore
from toolfleet.settings import FleetSettings
from toolfleet.storage.pools import (
    ExecutorPresence,
    RedisPoolPresence,
    RedisQueuedCalls,
    live_executors,
    pools_in_use,
    queued_call,
)
from toolfleet.storage.postgres import create_pool, migrate
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration

POOLS = "0012_executor_pools.sql"


async def test_executors_are_live_while_they_announce_themselves(settings: FleetSettings) -> None:
    redis = connect_redis(settings.redis_url)
    prefix = f"p{uuid.uuid4().hex[:6]}."
    try:
        short = RedisPoolPresence(redis, topic_prefix=prefix, ttl_s=0.3)
        await short.announce(ExecutorPresence(worker_id="a", pools=("default", "gpu")))
        await RedisPoolPresence(redis, topic_prefix=prefix).announce(
            ExecutorPresence(worker_id="b", pools=("gpu",), partitions={"gpu": (0, 2)})
        )
        assert await live_executors(redis, topic_prefix=prefix) == {"default": 1, "gpu": 2}
        assert await live_executors(redis, topic_prefix="another.") == {}  # fleets apart

        async def a_gone() -> bool:
            return await live_executors(redis, topic_prefix=prefix) == {"gpu": 1}

        await eventually(a_gone, timeout=5)
        [b] = await RedisPoolPresence(redis, topic_prefix=prefix).live()
        assert b.partitions == {"gpu": (0, 2)}
        await RedisPoolPresence(redis, topic_prefix=prefix).withdraw("b")
        assert await live_executors(redis, topic_prefix=prefix) == {}
    finally:
        await redis.aclose()


async def test_a_due_call_is_claimed_by_one_sweeper_at_a_time(settings: FleetSettings) -> None:
    redis = connect_redis(settings.redis_url)
    index = RedisQueuedCalls(redis, topic_prefix=f"p{uuid.uuid4().hex[:6]}.")
    try:
        event = Lifecycle(tool_id="acme__render").authorized()
        call = event.data_as(InvokeAuthorized)
        queued = queued_call(event, call, pool="gpu", reason="tool_not_loaded", parked_by="w")
        await index.add(queued)
        assert [q.call for q in await index.parked(limit=5)] == [queued.call]
        due = queued.deadline
        assert await index.claim_due(due - timedelta(seconds=1), limit=5, lease_s=30) == []
        claims = await asyncio.gather(
            *(index.claim_due(due, limit=5, lease_s=30) for _ in range(5))
        )
        assert sorted(len(c) for c in claims) == [0, 0, 0, 0, 1]  # one sweeper wins
        [[claimed]] = [c for c in claims if c]
        assert claimed == queued
        again = await index.claim_due(due + timedelta(seconds=31), limit=5, lease_s=30)
        assert again == [queued]
        await index.unpark(queued.call)
        assert await index.parked(limit=5) == []
        await index.drop(queued.call)
        assert await index.claim_due(due + timedelta(days=1), limit=5, lease_s=30) == []
    finally:
        await redis.aclose()


def _manifest(tool_id: str, pool: str = "default") -> ToolManifest:
    return ToolManifest(
        tool_id=tool_id,
        version="1.0.0",
        effect=Effect.READ_ONLY,
        input_schema={"type": "object"},
        output_schema={"type": "object"},
        redaction_allowlist=[],
        timeout_seconds=5,
        pool=pool,
    )


async def test_the_registry_keeps_each_versions_pool_and_a_restart_may_move_it(
    settings: FleetSettings,
) -> None:
    pool = await create_pool(settings.database_url)
    try:
        store = RegistryStore(pool)
        tool_id, gone = f"pools__t{uuid.uuid4().hex[:8]}", f"pools__g{uuid.uuid4().hex[:8]}"
        gpu, tpu = f"gpu{uuid.uuid4().hex[:6]}", f"tpu{uuid.uuid4().hex[:6]}"
        assert await store.register(_manifest(tool_id, gpu)) is True
        lookup = ToolLookup(store, ttl_s=0)
        assert (await lookup.resolve(tool_id, "1.0.0")).manifest.pool == gpu
        assert gpu in await pools_in_use(pool)
        # The same version from an executor whose module now names another pool: moved.
        assert await store.register(_manifest(tool_id, tpu)) is False
        assert (await lookup.resolve(tool_id, "1.0.0")).manifest.pool == tpu
        assert (await store.versions(tool_id))[0].pool == tpu
        in_use = await pools_in_use(pool)
        assert tpu in in_use
        assert gpu not in in_use
        assert "default" in in_use
        # A removed version names no pool in use.
        removed = f"rm{uuid.uuid4().hex[:6]}"
        await store.register(_manifest(gone, removed))
        await store.change_lifecycle(
            LifecycleChange(
                tool_id=gone, version="1.0.0", state=LifecycleState.REMOVED, operator="ops"
            )
        )
        assert removed not in await pools_in_use(pool)
    finally:
        await pool.close()


@pytest.fixture
async def before_0012(postgres_admin_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A database migrated as a fleet was before migration 0012."""
    async with database_before(postgres_admin_url, POOLS) as pool:
        yield pool


async def test_tools_registered_before_pools_are_in_default_and_calls_may_queue(
    before_0012: asyncpg.Pool,
) -> None:
    pool = before_0012
    old = _manifest("pools__old")
    await pool.execute(
        "INSERT INTO tool_definitions (tool_id, namespace, name) VALUES ($1, 'pools', 'old')",
        old.tool_id,
    )
    await pool.execute(
        """INSERT INTO tool_versions (tool_id, version, major, minor, patch, prerelease,
               lifecycle_state, effect, input_schema, output_schema, redaction_allowlist,
               timeout_seconds, schema_hash, manifest)
           VALUES ($1, '1.0.0', 1, 0, 0, '', 'active', 'read_only', '{}', '{}', '{}', 5, $2, $3)""",
        old.tool_id,
        old.schema_hash,
        {k: v for k, v in old.model_dump(mode="json").items() if k != "pool"},
    )
    queued_row = (
        "INSERT INTO tool_invocations (invocation_id, tenant_id, tool_id, status, status_rank)"
        " VALUES ($1, 't1', 'pools__old', 'queued', 1)"
    )
    with pytest.raises(asyncpg.CheckViolationError):
        await pool.execute(queued_row, uuid.uuid4())

    assert POOLS in await migrate(pool)

    assert await pools_in_use(pool) == {"default"}
    [stored] = await RegistryStore(pool).versions(old.tool_id)
    assert stored.pool == "default"
    await pool.execute(queued_row, uuid.uuid4())  # a status the projection may now write
