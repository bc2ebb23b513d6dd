"""The accepted-calls note, the same behaviour from Redis and from its in-memory twin."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from toolfleet.events.identity import CallKey
from toolfleet.storage.accepted import (
    ACCEPTED_TTL_S,
    AcceptedCalls,
    MemoryAcceptedCalls,
    RedisAcceptedCalls,
    accepted_key,
)
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["redis", "memory"])
async def accepted(request: pytest.FixtureRequest, redis_url: str) -> AsyncIterator[AcceptedCalls]:
    if request.param == "memory":
        yield MemoryAcceptedCalls()
        return
    redis = connect_redis(redis_url)
    try:
        yield RedisAcceptedCalls(redis)
    finally:
        await redis.aclose()


async def test_a_call_is_accepted_for_its_own_tenant_and_for_an_admin_only(
    accepted: AcceptedCalls,
) -> None:
    call = CallKey(tenant_id="t_a", invocation_id=str(uuid.uuid4()))
    assert not await accepted.was_accepted(call.invocation_id, tenant_id="t_a")
    assert not await accepted.was_accepted(call.invocation_id, tenant_id=None)

    await accepted.accept(call)

    assert await accepted.was_accepted(call.invocation_id, tenant_id="t_a")
    assert await accepted.was_accepted(call.invocation_id, tenant_id=None)  # an admin
    assert not await accepted.was_accepted(call.invocation_id, tenant_id="t_b")
    assert not await accepted.was_accepted(str(uuid.uuid4()), tenant_id="t_a")


async def test_another_tenant_reusing_the_id_adds_only_itself(accepted: AcceptedCalls) -> None:
    invocation_id = str(uuid.uuid4())
    await accepted.accept(CallKey(tenant_id="t_a", invocation_id=invocation_id))
    await accepted.accept(CallKey(tenant_id="t_b", invocation_id=invocation_id))
    assert await accepted.was_accepted(invocation_id, tenant_id="t_a")
    assert await accepted.was_accepted(invocation_id, tenant_id="t_b")
    assert not await accepted.was_accepted(invocation_id, tenant_id="t_c")


async def test_the_redis_note_expires(redis_url: str) -> None:
    redis = connect_redis(redis_url)
    try:
        call = CallKey(tenant_id="t_a", invocation_id=str(uuid.uuid4()))
        await RedisAcceptedCalls(redis).accept(call)
        ttl = await redis.ttl(accepted_key(call.invocation_id))
        assert 0 < ttl <= ACCEPTED_TTL_S
    finally:
        await redis.aclose()


async def test_the_memory_note_expires_on_its_clock() -> None:
    clock = Clock()
    accepted = MemoryAcceptedCalls(clock=clock)
    call = CallKey(tenant_id="t_a", invocation_id=str(uuid.uuid4()))
    await accepted.accept(call)
    clock.now += ACCEPTED_TTL_S - 1
    assert await accepted.was_accepted(call.invocation_id, tenant_id="t_a")
    clock.now += 2
    assert not await accepted.was_accepted(call.invocation_id, tenant_id="t_a")
