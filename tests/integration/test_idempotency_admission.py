"""Rate limit and idempotency claim as one script; the cheap "owns a key?" check."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from toolfleet.events.identity import CallKey
from toolfleet.policy.admission import AdmitInput
from toolfleet.policy.idempotency import ClaimKind
from toolfleet.policy.ratelimit import RateLimits
from toolfleet.policy.redis_stores import (
    RedisAdmission,
    RedisIdempotencyStore,
    RedisRateLimiter,
)
from toolfleet.policy.service import parameters_hash
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration

HASH = parameters_hash("core__echo", "1.0.0", {"message": "hi"})
OTHER = parameters_hash("core__echo", "1.0.0", {"message": "bye"})


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect_redis(redis_url, max_connections=128)
    yield client
    await client.aclose()


class Stores:
    def __init__(self, redis: Redis) -> None:
        prefix = f"test:{uuid.uuid4().hex}:"
        self.limiter = RedisRateLimiter(redis, prefix=prefix)
        self.idempotency = RedisIdempotencyStore(redis, prefix=prefix)
        self.admission = RedisAdmission(self.limiter, self.idempotency)


def k(invocation_id: str, tenant: str = "t_acme") -> CallKey:
    return CallKey(tenant_id=tenant, invocation_id=invocation_id)


def _admit(
    key: str, invocation_id: str, request_hash: str = HASH, *, limits: RateLimits
) -> AdmitInput:
    return AdmitInput(
        tenant_id="t_acme",
        tool_id="core__echo",
        limits=limits,
        idempotency_key=key,
        invocation_id=invocation_id,
        request_hash=request_hash,
        ttl_s=60,
    )


async def test_admission_claims_only_what_the_rate_limit_lets_through(redis: Redis) -> None:
    stores = Stores(redis)
    limits = RateLimits(tenant_per_minute=60, tenant_burst=2, tool_per_minute=600)
    first, second, third = (str(uuid.uuid4()) for _ in range(3))

    new = await stores.admission.admit(_admit("k1", first, limits=limits))
    assert new.rate.allowed
    assert new.claim is not None
    assert (new.claim.kind, new.claim.first_invocation_id) == (ClaimKind.NEW, first)

    dup = await stores.admission.admit(_admit("k1", second, limits=limits))
    assert dup.claim is not None
    assert (dup.claim.kind, dup.claim.first_invocation_id, dup.claim.outcome_json) == (
        ClaimKind.DUPLICATE,
        first,
        None,
    )

    refused = await stores.admission.admit(_admit("k2", third, limits=limits))
    assert not refused.rate.allowed
    assert refused.rate.retry_after_s is not None
    assert refused.rate.retry_after_s > 0
    assert refused.claim is None
    # Nothing was claimed: the key is still free.
    other = await stores.idempotency.claim("t_acme", "k2", str(uuid.uuid4()), OTHER)
    assert other.kind is ClaimKind.NEW
    assert await stores.idempotency.owns_keys([k(third)]) == [False]


async def test_admission_answers_as_the_two_steps_one_after_the_other(redis: Redis) -> None:
    together, apart = Stores(redis), Stores(redis)
    limits = RateLimits(tool_per_minute=60, tool_burst=3)
    keys = ["a", "b", "a", "c", "d"]
    hashes = [HASH, HASH, OTHER, HASH, HASH]
    for key, digest in zip(keys, hashes, strict=True):
        invocation_id = str(uuid.uuid4())
        admitted = await together.admission.admit(_admit(key, invocation_id, digest, limits=limits))
        rate = await apart.limiter.acquire("t_acme", "core__echo", limits)
        assert admitted.rate.allowed == rate.allowed
        if not rate.allowed:
            assert admitted.claim is None
            continue
        claim = await apart.idempotency.claim("t_acme", key, invocation_id, digest, ttl_s=60)
        assert admitted.claim is not None
        assert admitted.claim.kind == claim.kind


async def test_owns_keys_knows_owners_of_any_process(redis: Redis) -> None:
    prefix = f"test:{uuid.uuid4().hex}:"
    here, there = (RedisIdempotencyStore(redis, prefix=prefix) for _ in range(2))
    owner, duplicate, stranger = (str(uuid.uuid4()) for _ in range(3))
    await there.claim("t_acme", "k", owner, HASH)
    await there.add_waiter(k(owner), duplicate, "{}")
    assert await here.owns_keys([k(owner), k(duplicate), k(stranger)]) == [True, False, False]
    # The same invocation id in another tenant is another call: it owns nothing.
    assert await here.owns_keys([k(owner, "t_other")]) == [False]
    assert await there.owns_keys([k(owner, "t_other")]) == [False]
    assert await here.owns_keys([]) == []
    assert await there.owns_keys([k(owner)]) == [True]  # remembered locally, no round trip
    await there.finish(k(owner), '{"done": true}')
    await there.claim("t_acme", "k2", stranger, HASH)
    # Its outcome stays for later duplicates; a new owner is seen from anywhere.
    assert await here.owns_keys([k(stranger), k(duplicate), k(owner)]) == [True, False, True]
