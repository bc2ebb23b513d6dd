"""Revocation by ``jti`` against a real Redis, through the port and the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis as sync_redis
from redis.asyncio import Redis
from typer.testing import CliRunner

from tests.support.eventually import eventually
from toolfleet.auth.keys import generate_key_pair
from toolfleet.auth.tokens import TokenIssuer, TokenVerifier
from toolfleet.cli.main import app
from toolfleet.errors import PermissionDenied
from toolfleet.storage.redis import connect_redis
from toolfleet.storage.revocation import (
    CachedRevocationList,
    MemoryRevocationList,
    RedisRevocationList,
    ensure_not_revoked,
    remaining_ttl_s,
    revocation_key,
)

pytestmark = pytest.mark.integration


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect_redis(redis_url)
    yield client
    await client.aclose()


async def test_revoked_token_is_refused_for_its_remaining_lifetime(redis: Redis) -> None:
    pair = generate_key_pair()
    token = TokenIssuer(pair.private_pem, issuer="i", audience="a").issue(
        tenant_id="t1", agent_did="did:agent:a", tool_id="*", ttl_s=600
    )
    capability = TokenVerifier([pair.public_pem], issuer="i", audience="a").verify(token)
    revocations = RedisRevocationList(redis)
    await ensure_not_revoked(revocations, capability)
    assert not await revocations.is_revoked(capability.jti)

    await revocations.revoke_capability(capability)
    assert await revocations.is_revoked(capability.jti)
    with pytest.raises(PermissionDenied, match="revoked"):
        await ensure_not_revoked(revocations, capability)
    ttl = await redis.ttl(f"token:revoked:{capability.jti}")
    assert 600 < ttl <= 600 + 31 + 1


async def test_ttl_is_capped_and_malformed_jtis_count_as_revoked(redis: Redis) -> None:
    revocations = RedisRevocationList(redis, max_ttl_s=100)
    jti = str(uuid.uuid4())
    await revocations.revoke(jti, ttl_s=10_000)
    assert 0 < await redis.ttl(revocation_key(jti)) <= 100
    assert await revocations.is_revoked("has space")
    assert await revocations.is_revoked("")
    with pytest.raises(ValueError, match="jti"):
        await revocations.revoke("x" * 300, ttl_s=10)
    assert remaining_ttl_s(int(time.time()) - 1000) == 1
    assert remaining_ttl_s(int(time.time()) + 10**9, max_ttl_s=50) == 50


async def test_memory_revocation_list_expires() -> None:
    now = [0.0]
    revocations = MemoryRevocationList(clock=lambda: now[0])
    await revocations.revoke("j", ttl_s=10)
    assert await revocations.is_revoked("j")
    now[0] = 11
    assert not await revocations.is_revoked("j")


def test_cli_token_revoke_writes_redis(redis_url: str) -> None:
    jti = str(uuid.uuid4())
    env = {"TOOLFLEET_REDIS_URL": redis_url}
    result = CliRunner().invoke(app, ["token", "revoke", jti, "--ttl", "120"], env=env)
    assert result.exit_code == 0, result.output
    client = sync_redis.Redis.from_url(redis_url)
    try:
        assert 0 < client.ttl(f"token:revoked:{jti}") <= 120
        default = str(uuid.uuid4())
        result = CliRunner().invoke(app, ["token", "revoke", default], env=env)
        assert result.exit_code == 0, result.output
        assert client.ttl(f"token:revoked:{default}") > 29 * 24 * 3600
    finally:
        client.close()


def test_cli_token_revoke_without_redis_is_a_friendly_error() -> None:
    result = CliRunner().invoke(
        app,
        ["token", "revoke", "j1"],
        env={"TOOLFLEET_REDIS_URL": "redis://127.0.0.1:9/0"},
    )
    assert result.exit_code == 1
    assert "cannot reach Redis" in result.output


@contextlib.asynccontextmanager
async def listening_cache(
    redis_url: str, *, ttl_s: float = 300, name: str | None = None
) -> AsyncIterator[tuple[CachedRevocationList, asyncio.Event]]:
    """Another process's cached list: its own connection and listener."""
    client = Redis.from_url(redis_url, client_name=name)
    revocations = CachedRevocationList(RedisRevocationList(client), ttl_s=ttl_s)
    stop, subscribed = asyncio.Event(), asyncio.Event()
    listener = asyncio.create_task(revocations.listen(client, stop, subscribed=subscribed))
    try:
        await asyncio.wait_for(subscribed.wait(), timeout=5)
        yield revocations, subscribed
    finally:
        stop.set()
        await asyncio.wait_for(listener, timeout=5)
        await client.aclose()


async def test_a_revocation_reaches_every_cache_within_a_second(
    redis: Redis, redis_url: str
) -> None:
    jti = str(uuid.uuid4())
    async with (
        listening_cache(redis_url) as (api, _),
        listening_cache(redis_url) as (executor, _),
    ):
        # Both remember "not revoked" for 300 s: seeing the revocation sooner proves the push.
        assert not await api.is_revoked(jti)
        assert not await executor.is_revoked(jti)
        await RedisRevocationList(redis).revoke(jti, ttl_s=600)

        async def everywhere() -> bool:
            return await api.is_revoked(jti) and await executor.is_revoked(jti)

        # How soon exactly, bench/revocation_push_bench.py measures.
        await eventually(everywhere, timeout=1.0, interval=0.01)


async def test_a_cache_whose_listener_lost_its_connection_asks_redis(
    redis: Redis, redis_url: str
) -> None:
    jti, name = str(uuid.uuid4()), f"revocation-listener-{uuid.uuid4().hex[:8]}"
    async with listening_cache(redis_url, name=name) as (revocations, subscribed):
        assert not await revocations.is_revoked(jti)  # remembered for 300 s
        subscribed.clear()
        # Drop the listener's connection from the server side, as a Redis restart would...
        for client in await redis.client_list(_type="pubsub"):
            if client.get("name") == name:
                await redis.client_kill_filter(_id=client["id"])
        # ...and revoke silently (no announcement): only Redis knows.
        await redis.set(revocation_key(jti), b"1", ex=600)

        async def refused() -> bool:
            return await revocations.is_revoked(jti)

        await eventually(refused, timeout=5, interval=0.02)

        async def resubscribed() -> bool:
            return subscribed.is_set()

        await eventually(resubscribed, timeout=10)
        other = str(uuid.uuid4())
        assert not await revocations.is_revoked(other)
        await RedisRevocationList(redis).revoke(other, ttl_s=600)
        await eventually(lambda: revocations.is_revoked(other), timeout=1.0, interval=0.01)
