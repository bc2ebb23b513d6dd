"""Revocation by ``jti`` against a real Redis, through the port and the CLI."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis as sync_redis
from redis.asyncio import Redis
from typer.testing import CliRunner

from toolfleet.auth.keys import generate_key_pair
from toolfleet.auth.revocation import (
    MemoryRevocationList,
    RedisRevocationList,
    ensure_not_revoked,
    remaining_ttl_s,
    revocation_key,
)
from toolfleet.auth.tokens import TokenIssuer, TokenVerifier
from toolfleet.cli.main import app
from toolfleet.errors import PermissionDenied
from toolfleet.storage.redis import connect_redis

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
