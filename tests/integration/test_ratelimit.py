"""The Redis rate limiter: one Lua script, server time, atomic under concurrency."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from toolfleet.policy.ratelimit import MemoryRateLimiter, RateLimits
from toolfleet.policy.redis_stores import RedisRateLimiter
from toolfleet.storage.lua import LuaScript
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration

ECHO = "core__echo"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect_redis(redis_url, max_connections=256)
    yield client
    await client.aclose()


@pytest.fixture
def prefix() -> str:
    return f"test:{uuid.uuid4().hex}:"


async def test_burst_then_denied_with_retry_after(redis: Redis, prefix: str) -> None:
    limiter = RedisRateLimiter(redis, prefix=prefix)
    limits = RateLimits(tenant_per_minute=60, tenant_burst=5)
    decisions = [await limiter.acquire("t1", ECHO, limits) for _ in range(6)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False]
    assert decisions[5].retry_after_s is not None
    assert 0.5 < decisions[5].retry_after_s <= 1.0  # one token per second at 60/min


async def test_refills_over_time(redis: Redis, prefix: str) -> None:
    limiter = RedisRateLimiter(redis, prefix=prefix)
    limits = RateLimits(tool_per_minute=1200, tool_burst=2)  # 20 tokens/s
    assert (await limiter.acquire("t1", ECHO, limits)).allowed
    assert (await limiter.acquire("t1", ECHO, limits)).allowed
    refused = await limiter.acquire("t1", ECHO, limits)
    assert not refused.allowed
    assert refused.retry_after_s is not None
    assert refused.retry_after_s <= 0.05
    await asyncio.sleep(refused.retry_after_s + 0.01)  # let the bucket refill: real time
    assert (await limiter.acquire("t1", ECHO, limits)).allowed


async def test_concurrent_acquires_never_over_grant(redis: Redis, prefix: str) -> None:
    limiters = [RedisRateLimiter(redis, prefix=prefix) for _ in range(4)]  # many replicas
    limits = RateLimits(tenant_per_minute=1, tenant_burst=50, tool_per_minute=1, tool_burst=80)
    decisions = await asyncio.gather(
        *(limiters[i % 4].acquire("t1", ECHO, limits) for i in range(200))
    )
    assert sum(d.allowed for d in decisions) == 50
    # The tool bucket gave exactly as many tokens as the tenant bucket allowed.
    tokens = await redis.hget(f"{prefix}ratelimit:{{t1}}:{ECHO}", "tokens")
    assert tokens is not None
    assert float(tokens) == pytest.approx(30, abs=0.01)


async def test_a_refusal_consumes_from_neither_bucket(redis: Redis, prefix: str) -> None:
    limiter = RedisRateLimiter(redis, prefix=prefix)
    limits = RateLimits(tenant_per_minute=1, tenant_burst=3, tool_per_minute=1, tool_burst=1)
    assert (await limiter.acquire("t1", ECHO, limits)).allowed
    for _ in range(5):
        assert not (await limiter.acquire("t1", ECHO, limits)).allowed  # tool bucket empty
    # The tenant bucket lost only the one granted token.
    assert (await limiter.acquire("t1", "core__other", limits)).allowed
    assert (await limiter.acquire("t1", "core__third", limits)).allowed
    assert not (await limiter.acquire("t1", "core__fourth", limits)).allowed


async def test_tenants_are_isolated(redis: Redis, prefix: str) -> None:
    limiter = RedisRateLimiter(redis, prefix=prefix)
    limits = RateLimits(tenant_per_minute=1, tenant_burst=1)
    assert (await limiter.acquire("t_a", ECHO, limits)).allowed
    assert not (await limiter.acquire("t_a", ECHO, limits)).allowed
    assert (await limiter.acquire("t_b", ECHO, limits)).allowed
    # Tenant "t:x" and tenant "t"'s tool "x" are different buckets.
    assert (await limiter.acquire("t:x", ECHO, limits)).allowed
    assert (await limiter.acquire("t", "x", RateLimits(tool_per_minute=1, tool_burst=1))).allowed


async def test_unlimited_makes_no_redis_call(prefix: str) -> None:
    limiter = RedisRateLimiter(None, prefix=prefix)  # type: ignore[arg-type]
    assert (await limiter.acquire("t1", ECHO, RateLimits())).allowed


async def test_idle_buckets_expire(redis: Redis, prefix: str) -> None:
    limiter = RedisRateLimiter(redis, prefix=prefix)
    await limiter.acquire("t1", ECHO, RateLimits(tenant_per_minute=600, tenant_burst=20))
    ttl = await redis.ttl(f"{prefix}ratelimit:{{t1}}")
    assert 0 < ttl <= 3  # full again after 20 tokens at 10/s, plus a second


async def test_script_is_sent_in_full_only_when_the_server_lacks_it(redis: Redis) -> None:
    script = LuaScript("probe", source=f"-- {uuid.uuid4()}\nreturn ARGV[1]")
    assert await redis.script_exists(script.sha) == [False]
    assert await script(redis, [], ["a"]) == b"a"  # NOSCRIPT, then EVAL
    assert await redis.script_exists(script.sha) == [True]
    assert await script(redis, [], ["b"]) == b"b"  # EVALSHA


async def test_uses_the_redis_server_clock(redis: Redis, prefix: str) -> None:
    limiter = RedisRateLimiter(redis, prefix=prefix)
    await limiter.acquire("t1", ECHO, RateLimits(tenant_per_minute=60, tenant_burst=2))
    stamp = await redis.hget(f"{prefix}ratelimit:{{t1}}", "ts")
    seconds, micros = await redis.time()
    assert stamp is not None
    assert seconds + micros / 1e6 - 1 < float(stamp) <= seconds + micros / 1e6


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    steps=st.lists(
        st.tuples(
            st.floats(min_value=0, max_value=2, allow_nan=False),
            st.sampled_from([ECHO, "core__other"]),
        ),
        min_size=1,
        max_size=40,
    ),
    tenant=st.tuples(st.integers(1, 600), st.integers(1, 8)),
    tool=st.tuples(st.integers(1, 600), st.integers(1, 4)),
)
async def test_lua_script_matches_the_reference_model(
    redis: Redis,
    steps: list[tuple[float, str]],
    tenant: tuple[int, int],
    tool: tuple[int, int],
) -> None:
    """Differential test: the same calls at the same (fake) times decide the same."""
    now = [time.time()]
    remote = RedisRateLimiter(redis, prefix=f"test:{uuid.uuid4().hex}:", clock=lambda: now[0])
    model = MemoryRateLimiter(clock=lambda: now[0])
    limits = RateLimits(
        tenant_per_minute=tenant[0],
        tenant_burst=tenant[1],
        tool_per_minute=tool[0],
        tool_burst=tool[1],
    )
    for gap, tool_id in steps:
        now[0] += gap
        got = await remote.acquire("t1", tool_id, limits)
        want = await model.acquire("t1", tool_id, limits)
        assert got.allowed == want.allowed
        if not want.allowed:
            assert got.retry_after_s == pytest.approx(want.retry_after_s, rel=1e-9, abs=1e-9)
