"""Execution leases and fencing epochs against the real Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from tests.support.lifecycle import Lifecycle
from toolfleet.events.envelope import Emitted
from toolfleet.events.identity import CallKey
from toolfleet.events.types import TopicName
from toolfleet.executor.leasing.fencing import Fence, epoch_key, lease_key, runs_key
from toolfleet.executor.leasing.guard import LeaseGuard, LeaseLost
from toolfleet.executor.leasing.leases import (
    Finished,
    Held,
    OutgoingEvent,
    RedisLeases,
    Taken,
    done_key,
)
from toolfleet.storage.lua import CoalescedScripts, LuaScript

pytestmark = pytest.mark.integration


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def new_id(tenant: str = "t_acme") -> CallKey:
    """A new call: leases are taken per call, a tenant's invocation."""
    return CallKey(tenant_id=tenant, invocation_id=str(uuid.uuid4()))


async def test_epochs_grow_and_a_live_lease_is_held(redis: Redis) -> None:
    leases = RedisLeases(redis, ttl_s=0.3)
    inv = new_id()
    before_ms = time.time_ns() // 1_000_000
    first = await leases.acquire(inv, "a")
    assert isinstance(first, Taken)
    assert first.fence.run == 1
    assert first.fence.epoch >= before_ms  # a new counter starts at the clock, not at 1
    held = await leases.acquire(inv, "b")
    assert isinstance(held, Held)
    assert held.owner == "a"
    assert 0 < held.expires_in_s <= 0.3
    await asyncio.sleep(0.4)  # a's lease lapses: b takes over under a larger epoch
    second = await leases.acquire(inv, "b")
    assert second == Taken(Fence(inv, first.fence.epoch + 1, run=2))
    assert int(await redis.get(epoch_key(inv))) == first.fence.epoch + 1


async def test_leases_taken_together_each_get_their_own_answer(redis: Redis) -> None:
    leases = RedisLeases(redis, ttl_s=5)
    invocations = [new_id() for _ in range(20)]
    assert isinstance(await leases.acquire(invocations[0], "other"), Taken)
    replies = await asyncio.gather(*(leases.acquire(inv, "a") for inv in invocations))
    assert isinstance(replies[0], Held)
    assert replies[0].owner == "other"
    for inv, reply in zip(invocations[1:], replies[1:], strict=True):
        assert isinstance(reply, Taken)
        assert (reply.fence.call, reply.fence.run) == (inv, 1)
    fences = [r.fence for r in replies[1:] if isinstance(r, Taken)]
    assert all(await asyncio.gather(*(leases.renew(f, "a") for f in fences)))
    await asyncio.gather(*(leases.release(f) for f in fences))
    assert not any(await asyncio.gather(*(redis.exists(lease_key(f.call)) for f in fences)))


async def test_scripts_sent_together_survive_a_server_without_them_and_fail_alone(
    redis: Redis,
) -> None:
    marker = uuid.uuid4().hex  # a script no server has seen: NOSCRIPT, then sent in full
    fresh = LuaScript("probe", source=f"return {{KEYS[1], ARGV[1], '{marker}'}}")
    broken = LuaScript("broken", source="return redis.call('NO_SUCH_COMMAND')")
    scripts = CoalescedScripts(redis)
    replies = await asyncio.gather(
        *(scripts.run(fresh, [f"k{i}"], [i]) for i in range(5)),
        scripts.run(broken, [], []),
        return_exceptions=True,
    )
    assert replies[:5] == [[f"k{i}".encode(), str(i).encode(), marker.encode()] for i in range(5)]
    assert isinstance(replies[5], ResponseError)


async def test_epochs_keep_growing_after_redis_loses_them(redis: Redis) -> None:
    leases = RedisLeases(redis, ttl_s=0.2)
    inv = new_id()
    first = await leases.acquire(inv, "a")
    await asyncio.sleep(0.3)
    second = await leases.acquire(inv, "b")
    assert isinstance(first, Taken)
    assert isinstance(second, Taken)
    # Redis comes back empty (restart, failover): the counters are gone.
    await redis.delete(lease_key(inv), epoch_key(inv), runs_key(inv))
    await asyncio.sleep(0.01)
    third = await leases.acquire(inv, "c")
    assert isinstance(third, Taken)
    assert third.fence.epoch > second.fence.epoch > first.fence.epoch
    assert third.fence.run == 1  # the run count did not survive; the fencing did


async def test_stale_epoch_cannot_renew_release_or_finish(redis: Redis) -> None:
    leases = RedisLeases(redis, ttl_s=0.2)
    inv = new_id()
    old = await leases.acquire(inv, "zombie")
    assert isinstance(old, Taken)
    await asyncio.sleep(0.3)
    new = await leases.acquire(inv, "successor")
    assert isinstance(new, Taken)
    assert new.fence.epoch == old.fence.epoch + 1

    assert not await leases.renew(old.fence, "zombie")
    await leases.release(old.fence)  # a no-op for a stale epoch
    assert await redis.hget(lease_key(inv), "owner") == b"successor"
    assert not await leases.finish(old.fence, [])
    assert await leases.renew(new.fence, "successor")


async def test_finish_records_the_outcome_and_a_redelivery_replays_it(redis: Redis) -> None:
    leases = RedisLeases(redis, ttl_s=5)
    lc = Lifecycle()
    inv = CallKey(tenant_id=lc.tenant, invocation_id=lc.invocation_id)
    taken = await leases.acquire(inv, "a")
    assert isinstance(taken, Taken)
    outcome = lc.executed()
    assert await leases.finish(
        taken.fence, [OutgoingEvent(topic=TopicName.EXECUTED, envelope=outcome)]
    )
    assert not await redis.exists(lease_key(inv))  # released with the claim

    again = await leases.acquire(inv, "b")
    assert isinstance(again, Finished)
    assert again.record.epoch == taken.fence.epoch
    assert [(e.topic, e.envelope) for e in again.record.events] == [(TopicName.EXECUTED, outcome)]


async def test_guard_waits_for_a_lapsed_owner_then_resumes_under_a_new_epoch(
    redis: Redis,
) -> None:
    leases = RedisLeases(redis, ttl_s=0.5)
    inv = new_id()
    dead = await leases.acquire(inv, "died-without-releasing")
    assert isinstance(dead, Taken)
    seen: list[Fence] = []

    async def work(fence: Fence) -> list[Emitted]:
        seen.append(fence)
        return []

    guard = LeaseGuard(leases=leases, worker_id="w2", poll_max_s=0.05)
    assert await guard.run(inv, work, stopping=lambda: False) == []
    assert seen == [Fence(inv, dead.fence.epoch + 1, run=2)]


async def test_guard_discards_work_whose_lease_was_taken_over(redis: Redis) -> None:
    leases = RedisLeases(redis, ttl_s=0.3)
    inv = new_id()
    guard = LeaseGuard(leases=leases, worker_id="zombie")
    cancelled = asyncio.Event()

    async def paused_past_its_lease(fence: Fence) -> list[Emitted]:
        # Another worker takes the call over with a newer epoch while this one runs.
        await redis.incr(epoch_key(fence.call))
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()  # the heartbeat noticed and stopped the tool
            raise
        return []

    with pytest.raises(LeaseLost):
        await guard.run(inv, paused_past_its_lease, stopping=lambda: False)
    assert cancelled.is_set()
    assert not await redis.exists(done_key(inv))


async def test_guard_heartbeat_keeps_a_long_call_owned(redis: Redis) -> None:
    # A TTL the heartbeat (every third of it) keeps alive on a loaded 2-core box too.
    leases = RedisLeases(redis, ttl_s=1.0)
    inv = new_id()
    guard = LeaseGuard(leases=leases, worker_id="w1")
    rival = RedisLeases(redis, ttl_s=1.0)
    holds: list[bool] = []

    async def long_call(fence: Fence) -> list[Emitted]:
        for _ in range(5):  # 3.5 s in all, over three TTLs
            await asyncio.sleep(0.7)
            holds.append(isinstance(await rival.acquire(inv, "rival"), Held))
        return []

    await guard.run(inv, long_call, stopping=lambda: False)
    assert holds == [True] * 5
    assert isinstance(await rival.acquire(inv, "rival"), Finished)
