"""What the lease's script reads with the lease, and one heartbeat for many leases."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from toolfleet.events.envelope import Emitted, Envelope, new_event
from toolfleet.events.identity import CallKey
from toolfleet.events.models import AgentContext, Effect, InvokeAuthorized
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.executor.checkpoints.store import (
    Checkpoint,
    MemoryCheckpointStore,
    RedisCheckpointStore,
    TieredCheckpointStore,
)
from toolfleet.executor.leasing.fencing import Fence
from toolfleet.executor.leasing.guard import LeaseGuard, LeaseLost
from toolfleet.executor.leasing.leases import Held, MemoryLeases, RedisLeases, Taken
from toolfleet.executor.service import ExecutorConfig, ExecutorPorts, ExecutorService
from toolfleet.registry.catalog import discover
from toolfleet.storage.cancel_flags import MemoryCancelFlags, RedisCancelFlags

pytestmark = pytest.mark.integration


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


class Emitter:
    def __init__(self) -> None:
        self.emitted: list[tuple[TopicName, Envelope]] = []

    async def emit(self, topic: TopicName, envelope: Envelope) -> Awaitable[object]:
        self.emitted.append((topic, envelope))
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def echo_call() -> Envelope:
    data = InvokeAuthorized(
        invocation_id=uuid.uuid4(),
        tool_id="core__echo",
        tool_version="1.0.0",
        requested_version="*",
        agent_context=AgentContext(agent_did="did:agent:a", tenant_id="t1"),
        parameters={"message": "hi"},
        effect=Effect.READ_ONLY,
        timeout_seconds=5,
        requested_at=datetime.now(UTC),
    )
    return new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data=data,
        tenant_id="t1",
        invocation_id=str(data.invocation_id),
    )


def call_of(event: Envelope) -> CallKey:
    return CallKey(tenant_id="t1", invocation_id=str(event.invocationid))


def new_call() -> CallKey:
    return CallKey(tenant_id="t1", invocation_id=str(uuid.uuid4()))


def service(redis: Redis, emitter: Emitter) -> ExecutorService:
    return ExecutorService(
        ports=ExecutorPorts(
            catalog=discover([]),
            checkpoints=TieredCheckpointStore(
                hot=RedisCheckpointStore(redis), cold=MemoryCheckpointStore()
            ),
            cancels=RedisCancelFlags(redis),
            emitter=emitter,
            lease_guard=LeaseGuard(leases=RedisLeases(redis, ttl_s=5), worker_id="w"),
        ),
        config=ExecutorConfig(
            worker_id="w",
            trust_lease_reads=True,
        ),
    )


async def test_the_lease_script_reads_the_cancel_flag_and_the_hot_checkpoint(
    redis: Redis,
) -> None:
    leases = RedisLeases(redis, ttl_s=5)
    fresh = await leases.acquire(new_call(), "a")
    assert isinstance(fresh, Taken)
    assert fresh.seen is not None
    assert (fresh.seen.cancel_requested, fresh.seen.hot_checkpoint) == (False, None)

    inv = new_call()
    await RedisCancelFlags(redis).request(inv)
    checkpoint = Checkpoint(
        checkpoint_id="c1",
        invocation_id=inv.invocation_id,
        tenant_id="t1",
        state={"step": 3},
        progress_percent=30,
        current_phase="p",
        timestamp=datetime.now(UTC),
    )
    await RedisCheckpointStore(redis).save(checkpoint)
    taken = await leases.acquire(inv, "a")
    assert isinstance(taken, Taken)
    assert taken.seen is not None
    assert taken.seen.cancel_requested
    assert taken.seen.hot_checkpoint is not None
    assert Checkpoint.model_validate_json(taken.seen.hot_checkpoint) == checkpoint


async def test_a_call_cancelled_before_it_ran_is_refused_from_the_lease_read(
    redis: Redis,
) -> None:
    emitter = Emitter()
    svc = service(redis, emitter)
    event = echo_call()
    await RedisCancelFlags(redis).request(call_of(event))
    [(topic, outcome)] = await svc.on_authorized(event)
    assert topic is TopicName.RESULTS
    assert outcome.data["error"]["code"] == "cancelled"
    assert emitter.emitted == []  # never started


async def test_a_run_resumes_from_the_hot_checkpoint_the_lease_read(redis: Redis) -> None:
    emitter = Emitter()
    svc = service(redis, emitter)
    event = echo_call()
    inv = str(event.invocationid)
    await RedisCheckpointStore(redis).save(
        Checkpoint(
            checkpoint_id="c-hot",
            invocation_id=inv,
            tenant_id="t1",
            state={},
            progress_percent=50,
            current_phase="p",
            timestamp=datetime.now(UTC),
        )
    )
    [(topic, outcome)] = await svc.on_authorized(event)
    assert topic is TopicName.EXECUTED
    assert outcome.data["execution_metadata"]["resumed_from_checkpoint_id"] == "c-hot"


async def test_without_trust_the_gates_ask_their_own_ports(redis: Redis) -> None:
    svc = service(redis, Emitter())
    svc = replace(
        svc,
        # another store than the leases' Redis
        ports=replace(svc.ports, cancels=MemoryCancelFlags()),
        config=replace(svc.config, trust_lease_reads=False),
    )
    event = echo_call()
    await svc.ports.cancels.request(call_of(event))
    [(topic, outcome)] = await svc.on_authorized(event)
    assert topic is TopicName.RESULTS
    assert outcome.data["error"]["code"] == "cancelled"


async def test_one_heartbeat_keeps_many_leases_and_stops_with_the_last() -> None:
    leases = MemoryLeases(ttl_s=0.3)
    guard = LeaseGuard(leases=leases, worker_id="w")
    invocations = [new_call() for _ in range(5)]
    rivals: list[bool] = []

    async def long_call(fence: Fence) -> list[Emitted]:
        for _ in range(4):  # 0.8 s: more than two TTLs
            await asyncio.sleep(0.2)
            rivals.append(isinstance(await leases.acquire(fence.call, "rival"), Held))
        return []

    await asyncio.gather(
        *(guard.run(inv, long_call, stopping=lambda: False) for inv in invocations)
    )
    assert rivals == [True] * 20
    assert guard._heartbeat is None  # nothing left running once no lease is held


async def test_a_lost_lease_cancels_its_own_run_only() -> None:
    leases = MemoryLeases(ttl_s=0.3)
    guard = LeaseGuard(leases=leases, worker_id="w")
    lost_inv, kept_inv = new_call(), new_call()

    async def taken_over(fence: Fence) -> list[Emitted]:
        leases.take_over(fence.call)  # another worker, a newer epoch
        await asyncio.sleep(5)
        return []

    async def kept(fence: Fence) -> list[Emitted]:
        await asyncio.sleep(0.5)
        return []

    lost, done = await asyncio.gather(
        guard.run(lost_inv, taken_over, stopping=lambda: False),
        guard.run(kept_inv, kept, stopping=lambda: False),
        return_exceptions=True,
    )
    assert isinstance(lost, LeaseLost)
    assert done == []
    assert kept_inv in leases.done
