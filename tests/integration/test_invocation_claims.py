"""The Redis invocation-id claim (``invocation_claim.lua``) against its in-memory twin."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from toolfleet.policy.claims import (
    CallIdentity,
    ClaimVerdict,
    MemoryInvocationClaims,
    RedisInvocationClaims,
)
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect_redis(redis_url, max_connections=64)
    yield client
    await client.aclose()


def identity(tenant: str, agent: str = "did:agent:x", params: str = "0" * 64) -> CallIdentity:
    return CallIdentity(
        tenant_id=tenant,
        agent_did=agent,
        tool_id="core__echo",
        requested_version="*",
        parameters_hash=params,
    )


async def test_concurrent_claims_of_one_id_have_one_winner(redis: Redis) -> None:
    claims = RedisInvocationClaims(redis, prefix=f"test:{uuid.uuid4().hex}:")
    invocation_id = str(uuid.uuid4())
    verdicts = await asyncio.gather(
        *(claims.claim(invocation_id, identity(f"t{i}")) for i in range(20))
    )
    assert verdicts.count(ClaimVerdict.NEW) == 1
    assert verdicts.count(ClaimVerdict.CONFLICT) == 19


async def test_a_claim_lives_for_its_ttl(redis: Redis) -> None:
    prefix = f"test:{uuid.uuid4().hex}:"
    invocation_id = str(uuid.uuid4())
    await RedisInvocationClaims(redis, prefix=prefix).claim(
        invocation_id, identity("t1"), ttl_s=300
    )
    ttl = await redis.ttl(f"{prefix}invocation:claim:{{{invocation_id}}}")
    assert 290 <= ttl <= 300


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 2),
            st.sampled_from(["t1", "t2"]),
            st.sampled_from(["did:agent:a", "did:agent:b"]),
            st.sampled_from(["0" * 64, "1" * 64]),
        ),
        min_size=1,
        max_size=30,
    )
)
async def test_lua_script_matches_the_reference_model(
    redis: Redis, steps: list[tuple[int, str, str, str]]
) -> None:
    """Differential test: the same claims in the same order give the same verdicts."""
    remote = RedisInvocationClaims(redis, prefix=f"test:{uuid.uuid4().hex}:")
    model = MemoryInvocationClaims()
    ids = [str(uuid.uuid4()) for _ in range(3)]
    for which, tenant, agent, params in steps:
        claimed = identity(tenant, agent, params)
        got = await remote.claim(ids[which], claimed)
        assert got is await model.claim(ids[which], claimed)
