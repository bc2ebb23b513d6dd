"""Policies in Postgres, the Redis cache and ``policy:updates`` against real servers."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from redis.asyncio import Redis

from tests.support.eventually import eventually
from toolfleet.policy.cache import RedisPolicyCache, cache_key, run_invalidation_listener
from toolfleet.policy.documents import PolicyDocument, TenantPolicy
from toolfleet.policy.postgres_policies import (
    PolicyStore,
    PolicyVersionConflict,
    seed_from_document,
)
from toolfleet.policy.provider import PolicyProvider
from toolfleet.storage.postgres import create_pool
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration

CORE = TenantPolicy(allow_tools=["core__*"])
ECHO = TenantPolicy(allow_tools=["core__echo"], max_concurrent_per_agent=1)

#: Far below the caches' 300 s TTL, far above a push on a loaded 2-core box.
PUSH_BOUND_S = 10.0


def tenant() -> str:
    return f"tenant_{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    created = await create_pool(database_url, min_size=1, max_size=4)
    yield created
    await created.close()


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect_redis(redis_url)
    yield client
    await client.aclose()


async def test_put_versions_and_keeps_history(pool: asyncpg.Pool) -> None:
    store, t = PolicyStore(pool), tenant()
    assert await store.get(t) is None
    assert await store.put(t, CORE, "did:admin:a") == 1
    assert await store.put(t, ECHO, "did:admin:b") == 2
    policy, version = await store.get(t) or (None, 0)
    assert (policy, version) == (ECHO, 2)
    history = await store.history(t)
    assert [(h.version, h.policy, h.updated_by) for h in history] == [
        (1, CORE, "did:admin:a"),
        (2, ECHO, "did:admin:b"),
    ]
    assert (await store.all())[t].version == 2


async def test_optimistic_writes(pool: asyncpg.Pool) -> None:
    store, t = PolicyStore(pool), tenant()
    assert await store.put(t, CORE, "a", expected_version=0) == 1
    with pytest.raises(PolicyVersionConflict):
        await store.put(t, ECHO, "b", expected_version=0)
    assert await store.put(t, ECHO, "b", expected_version=1) == 2
    with pytest.raises(PolicyVersionConflict) as stale:
        await store.put(t, CORE, "c", expected_version=1)
    assert stale.value.details == {"current_version": 2}
    with pytest.raises(PolicyVersionConflict):
        await store.put(tenant(), CORE, "d", expected_version=3)
    assert len(await store.history(t)) == 2


async def test_history_is_append_only(pool: asyncpg.Pool) -> None:
    store, t = PolicyStore(pool), tenant()
    await store.put(t, CORE, "a")
    with pytest.raises(asyncpg.RaiseError, match="append-only"):
        await pool.execute("DELETE FROM tool_policy_history WHERE tenant_id = $1", t)
    with pytest.raises(asyncpg.RaiseError, match="append-only"):
        await pool.execute(
            "UPDATE tool_policy_history SET updated_by = 'x' WHERE tenant_id = $1", t
        )


async def test_seed_applies_only_missing_tenants(pool: asyncpg.Pool) -> None:
    store, kept, fresh = PolicyStore(pool), tenant(), tenant()
    await store.put(kept, ECHO, "did:admin:a")
    announced: list[str] = []

    async def announce(tenant_id: str) -> None:
        announced.append(tenant_id)

    document = PolicyDocument(tenants={kept: CORE, fresh: CORE})
    assert await seed_from_document(store, document, announce=announce) == {fresh: 1}
    assert announced == [fresh]
    assert (await store.get(kept)) == (ECHO, 1)
    record = await store.record(fresh)
    assert record is not None
    assert record.updated_by == "seed:policy-file"
    assert await seed_from_document(store, document) == {}


async def test_redis_cache_hit(pool: asyncpg.Pool, redis: Redis) -> None:
    store, t = PolicyStore(pool), tenant()
    await store.put(t, CORE, "a")
    await PolicyProvider(store, shared=RedisPolicyCache(redis)).policy_for(t)
    assert await redis.hget(cache_key(t), "entry") is not None
    assert 0 < await redis.ttl(cache_key(t)) <= 300

    class Unreachable:
        async def get(self, tenant_id: str) -> None:
            raise AssertionError("a cache hit must not read Postgres")

    other = PolicyProvider(Unreachable(), shared=RedisPolicyCache(redis))
    assert await other.policy_for(t) == CORE


async def test_a_stale_reader_does_not_recache_after_announce(
    pool: asyncpg.Pool, redis: Redis
) -> None:
    cache, t = RedisPolicyCache(redis), tenant()
    _, epoch = await cache.load(t)  # a reader starts...
    await cache.announce(t)  # ...a writer commits and announces...
    from toolfleet.policy.provider import CachedEntry

    await cache.store(t, CachedEntry(policy=CORE, version=1), epoch)  # ...the reader stores late
    assert (await cache.load(t))[0] is None


async def test_put_reaches_another_process_through_the_channel_not_the_ttl(
    pool: asyncpg.Pool, redis: Redis, redis_url: str
) -> None:
    store, t = PolicyStore(pool), tenant()
    await store.put(t, CORE, "a")
    # Another policy process: its own Redis connection, provider and listener.
    remote_redis = connect_redis(redis_url)
    remote = PolicyProvider(store, shared=RedisPolicyCache(remote_redis), local_ttl_s=300)
    stop, subscribed = asyncio.Event(), asyncio.Event()
    listener = asyncio.create_task(
        run_invalidation_listener(remote_redis, remote, stop, subscribed=subscribed)
    )
    try:
        await asyncio.wait_for(subscribed.wait(), timeout=5)
        assert await remote.policy_for(t) == CORE  # now cached locally and in Redis

        await store.put(t, ECHO, "b")
        await RedisPolicyCache(redis).announce(t)

        async def sees_new_policy() -> bool:
            return await remote.policy_for(t) == ECHO

        # Both caches hold the old policy for 300 s: seeing the new one sooner proves the
        # push. How soon is a speed figure for bench/, not an assertion here.
        await eventually(sees_new_policy, timeout=PUSH_BOUND_S, interval=0.02)
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(listener, timeout=5)
        await remote_redis.aclose()


async def test_listener_resubscribes_after_losing_its_connection(
    pool: asyncpg.Pool, redis: Redis, redis_url: str
) -> None:
    store, t = PolicyStore(pool), tenant()
    await store.put(t, CORE, "a")
    name = f"policy-listener-{uuid.uuid4().hex[:8]}"
    remote_redis = Redis.from_url(redis_url, client_name=name)
    remote = PolicyProvider(store, shared=RedisPolicyCache(remote_redis))
    stop, subscribed = asyncio.Event(), asyncio.Event()
    listener = asyncio.create_task(
        run_invalidation_listener(remote_redis, remote, stop, subscribed=subscribed)
    )
    try:
        await asyncio.wait_for(subscribed.wait(), timeout=5)
        subscribed.clear()
        # Drop the listener's connection from the server side, as a Redis restart would.
        for client in await redis.client_list(_type="pubsub"):
            if client.get("name") == name:
                await redis.client_kill_filter(_id=client["id"])

        async def resubscribed() -> bool:
            return subscribed.is_set()

        await eventually(resubscribed, timeout=10)
        assert await remote.policy_for(t) == CORE
        await store.put(t, ECHO, "b")
        await RedisPolicyCache(redis).announce(t)

        async def sees_new_policy() -> bool:
            return await remote.policy_for(t) == ECHO

        # Both caches hold the old policy for 300 s: seeing the new one sooner proves the
        # push. How soon is a speed figure for bench/, not an assertion here.
        await eventually(sees_new_policy, timeout=PUSH_BOUND_S, interval=0.02)
    finally:
        stop.set()
        await asyncio.wait_for(listener, timeout=5)
        await remote_redis.aclose()
