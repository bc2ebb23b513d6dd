"""The Redis idempotency store: claims, duplicates, conflicts, waiters, TTL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from tests.support.eventually import eventually
from toolfleet.events.identity import CallKey
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.policy.idempotency import ClaimKind, Waiter, outcome_for_duplicate
from toolfleet.policy.redis_stores import RedisIdempotencyStore
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


@pytest.fixture
def store(redis: Redis) -> RedisIdempotencyStore:
    return RedisIdempotencyStore(redis, prefix=f"test:{uuid.uuid4().hex}:")


def _outcome(invocation_id: str) -> ToolOutcome:
    return ToolOutcome(
        invocation_id=uuid.UUID(invocation_id),
        status=InvocationStatus.SUCCESS,
        agent_did="did:agent:a",
        tenant_id="t_acme",
        tool_id="core__echo",
        tool_version="1.0.0",
        result={"message": "hi", "length": 2},
    )


def k(invocation_id: str, tenant: str = "t_acme") -> CallKey:
    """The call of ``invocation_id`` in ``tenant``: what owners are keyed by."""
    return CallKey(tenant_id=tenant, invocation_id=invocation_id)


def _ids(n: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(n)]


async def test_new_then_duplicate_then_conflict(store: RedisIdempotencyStore) -> None:
    first, second, third = _ids(3)
    claim = await store.claim("t_acme", "idem-1", first, HASH)
    assert (claim.kind, claim.first_invocation_id, claim.outcome_json) == (
        ClaimKind.NEW,
        first,
        None,
    )
    dup = await store.claim("t_acme", "idem-1", second, HASH)
    assert (dup.kind, dup.first_invocation_id, dup.outcome_json) == (
        ClaimKind.DUPLICATE,
        first,
        None,
    )
    conflict = await store.claim("t_acme", "idem-1", third, OTHER)
    assert (conflict.kind, conflict.first_invocation_id) == (ClaimKind.CONFLICT, first)
    # The owner claiming again (a redelivery) still owns the key.
    assert (await store.claim("t_acme", "idem-1", first, HASH)).kind == ClaimKind.NEW
    # Keys are per tenant.
    assert (await store.claim("t_other", "idem-1", third, OTHER)).kind == ClaimKind.NEW


async def test_duplicate_of_a_finished_owner_gets_its_outcome(
    store: RedisIdempotencyStore,
) -> None:
    first, second = _ids(2)
    await store.claim("t_acme", "idem-2", first, HASH)
    outcome = _outcome(first)
    assert await store.record_outcome(k(first), outcome.model_dump_json()) is True
    dup = await store.claim("t_acme", "idem-2", second, HASH)
    assert dup.kind == ClaimKind.DUPLICATE
    assert dup.first_outcome() == outcome
    answer = outcome_for_duplicate(outcome, invocation_id=second, agent_did="did:agent:b")
    assert str(answer.invocation_id) == second
    assert answer.result == outcome.result


async def test_outcomes_of_invocations_without_a_key_are_not_stored(
    store: RedisIdempotencyStore,
) -> None:
    (stranger,) = _ids(1)
    assert await store.record_outcome(k(stranger), _outcome(stranger).model_dump_json()) is False
    assert await store.finish(k(stranger), _outcome(stranger).model_dump_json()) == []


async def test_concurrent_claims_have_one_owner(redis: Redis) -> None:
    prefix = f"test:{uuid.uuid4().hex}:"
    stores = [RedisIdempotencyStore(redis, prefix=prefix) for _ in range(2)]  # two replicas
    key = "race"
    ids = _ids(50)
    claims = await asyncio.gather(
        *(stores[i % 2].claim("t_acme", key, inv, HASH) for i, inv in enumerate(ids))
    )
    owners = [c for c in claims if c.kind == ClaimKind.NEW]
    assert len(owners) == 1
    assert {c.first_invocation_id for c in claims} == {owners[0].first_invocation_id}


async def test_waiters_are_resolved_when_the_owner_finishes(
    store: RedisIdempotencyStore,
) -> None:
    first, second, third, late = _ids(4)
    await store.claim("t_acme", "idem-3", first, HASH)
    for waiter in (second, third):
        assert (await store.claim("t_acme", "idem-3", waiter, HASH)).outcome_json is None
        assert await store.add_waiter(k(first), waiter, f'{{"who":"{waiter}"}}') is None
    outcome_json = _outcome(first).model_dump_json()
    waiters = await store.finish(k(first), outcome_json)
    assert waiters == [
        Waiter(invocation_id=second, context_json=f'{{"who":"{second}"}}'),
        Waiter(invocation_id=third, context_json=f'{{"who":"{third}"}}'),
    ]
    assert await store.take_waiters(k(first)) == []  # handed over once
    # A duplicate that queues after the owner finished is answered at once instead.
    assert await store.add_waiter(k(first), late, "{}") == outcome_json
    assert await store.take_waiters(k(first)) == []


async def test_record_then_take_waiters_separately(store: RedisIdempotencyStore) -> None:
    first, second = _ids(2)
    await store.claim("t_acme", "idem-4", first, HASH)
    assert await store.add_waiter(k(first), second, "{}") is None
    assert await store.record_outcome(k(first), _outcome(first).model_dump_json())
    assert await store.take_waiters(k(first)) == [Waiter(invocation_id=second, context_json="{}")]


async def test_waiting_on_an_unknown_owner_fails(store: RedisIdempotencyStore) -> None:
    with pytest.raises(LookupError):
        await store.add_waiter(k(str(uuid.uuid4())), str(uuid.uuid4()), "{}")


async def test_keys_expire(store: RedisIdempotencyStore, redis: Redis) -> None:
    first, second = _ids(2)
    await store.claim("t_acme", "idem-5", first, HASH, ttl_s=1)
    await store.record_outcome(k(first), _outcome(first).model_dump_json())
    assert (await store.claim("t_acme", "idem-5", second, OTHER)).kind == ClaimKind.CONFLICT

    async def free_again() -> bool:
        return (await store.claim("t_acme", "idem-5", second, OTHER)).kind == ClaimKind.NEW

    await eventually(free_again, timeout=5)
    # The first's outcome went with its claim.
    assert await store.record_outcome(k(first), "{}") is False
