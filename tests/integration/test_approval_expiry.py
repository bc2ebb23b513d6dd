"""Pending approvals in Redis: indexed by expiry, claimed once, ended by the sweeper."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
from redis.asyncio import Redis

from tests.support.eventually import eventually
from tests.unit.test_approval_expiry import pending_approval
from toolfleet.events.identity import CallKey
from toolfleet.policy.approval_expiry import run_expiry_sweeper
from toolfleet.policy.redis_stores import RedisApprovalStore
from toolfleet.policy.service import PendingApproval
from toolfleet.storage.call_keys import call_scope
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect_redis(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def prefix() -> str:
    return f"test:{uuid.uuid4().hex}:"


def _expiring_in(seconds: float) -> PendingApproval:
    return pending_approval(expires_at=datetime.now(UTC) + timedelta(seconds=seconds))


def _id(pending: PendingApproval) -> CallKey:
    """The call an approval is stored under: its tenant and its invocation id."""
    return CallKey(tenant_id=pending.tenant_id, invocation_id=str(pending.authorized.invocation_id))


async def test_expired_approval_is_ended_exactly_once_by_two_sweepers(
    redis: Redis, prefix: str
) -> None:
    store = RedisApprovalStore(redis, prefix=prefix)
    expiring, waiting = _expiring_in(1), _expiring_in(3600)
    await store.put(_id(expiring), expiring, 1)
    await store.put(_id(waiting), waiting, 3600)
    assert await redis.zscore(
        f"{prefix}approval:expiries", call_scope(_id(expiring))
    ) == pytest.approx(expiring.expires_at.timestamp())
    emitted: list[tuple[int, CallKey]] = []

    def emitter(replica: int):  # type: ignore[no-untyped-def]
        async def emit(pending: PendingApproval) -> None:
            emitted.append((replica, _id(pending)))

        return emit

    stop = asyncio.Event()
    # Two policy replicas, each with its own store instance over the same Redis.
    sweepers = [
        asyncio.create_task(
            run_expiry_sweeper(
                RedisApprovalStore(redis, prefix=prefix), emitter(i), stop, interval_s=0.01
            )
        )
        for i in range(2)
    ]

    async def ended() -> bool:
        return (
            bool(emitted)
            and await redis.zscore(f"{prefix}approval:expiries", call_scope(_id(expiring))) is None
        )

    await eventually(ended, timeout=10)
    await asyncio.sleep(0.2)  # give a second (wrong) claim the chance to show up
    stop.set()
    await asyncio.gather(*sweepers)
    assert [inv for _, inv in emitted] == [_id(expiring)]
    # Its data is gone and a late human decision finds nothing to decide.
    assert await store.take(_id(expiring)) is None
    assert await redis.exists(f"{prefix}approval:expiring:{call_scope(_id(expiring))}") == 0
    # The other approval is untouched.
    assert (await store.take(_id(waiting))) == waiting


async def test_take_before_expiry_removes_it_from_the_index(redis: Redis, prefix: str) -> None:
    store = RedisApprovalStore(redis, prefix=prefix)
    pending = _expiring_in(1)
    await store.put(_id(pending), pending, 1)
    assert await store.take(_id(pending)) == pending
    assert await redis.zcard(f"{prefix}approval:expiries") == 0
    assert await store.due(datetime.now(UTC) + timedelta(hours=1)) == []


async def test_approvals_survive_a_policy_restart(redis: Redis, prefix: str) -> None:
    pending = _expiring_in(3600)
    await RedisApprovalStore(redis, prefix=prefix).put(_id(pending), pending, 3600)
    restarted = RedisApprovalStore(redis, prefix=prefix)  # a new process, same Redis
    assert await restarted.due(datetime.now(UTC)) == []
    assert await restarted.due(pending.expires_at) == [pending]


async def test_data_outlives_the_expiry_by_the_grace(redis: Redis, prefix: str) -> None:
    store = RedisApprovalStore(redis, prefix=prefix, grace_s=600)
    pending = _expiring_in(60)
    await store.put(_id(pending), pending, 60)
    ttl = await redis.ttl(f"{prefix}approval:pending:{call_scope(_id(pending))}")
    assert 600 < ttl <= 660


async def test_a_claim_not_acked_is_claimed_again_after_its_lease(
    redis: Redis, prefix: str
) -> None:
    store = RedisApprovalStore(redis, prefix=prefix, lease_s=1)
    pending = _expiring_in(-1)  # already expired (e.g. policy was down)
    await store.put(_id(pending), pending, 1)
    assert await store.due(datetime.now(UTC)) == [pending]  # then the sweeper dies
    assert await store.due(datetime.now(UTC)) == []  # leased
    assert await store.take(_id(pending)) is None  # no longer decidable by a human

    async def reclaimed() -> list[PendingApproval]:
        return await store.due(datetime.now(UTC))

    assert await eventually(reclaimed, timeout=5) == [pending]
    await store.ack(_id(pending))
    assert await redis.zcard(f"{prefix}approval:expiries") == 0


async def test_index_entries_without_data_are_dropped(redis: Redis, prefix: str) -> None:
    store = RedisApprovalStore(redis, prefix=prefix)
    await redis.zadd(f"{prefix}approval:expiries", {"gone": 1.0})
    assert await store.due(datetime.now(UTC)) == []
    assert await redis.zcard(f"{prefix}approval:expiries") == 0
