"""Executor pools against the real broker, Redis and Postgres, services in process.

Policy publishes a call of a pool's tool on that pool's topic, never on another; while
no executor of the pool is live the call is ``queued`` in the status projection with
its pool, and an executor started for the pool runs it. A producer with write access to
a pool's topic gets nothing run, and a tenant cannot pick a pool in its request.

Handing a call to another executor of its pool needs executors with worker ids of their
own, so separate processes: ``tests/e2e/test_pools.py``."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer

from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet, running_services
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.producer import Outbound
from toolfleet.client.requests import invoke_request
from toolfleet.errors import ErrorCode
from toolfleet.events.codec import decode
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.models import AgentContext, Effect, InvocationStatus, InvokeAuthorized
from toolfleet.events.types import EventType, Source, TopicName, pool_topic
from toolfleet.executor.settings import ExecutorSettings
from toolfleet.settings import FleetSettings
from toolfleet.storage.pools import live_executors
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration

AGENT = "did:agent:pools"
POLICY = {"tenants": {"*": {"allow_tools": ["core__*", "acme__*", "extra__*", "idle__*"]}}}


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    """Policy, status, the validator and a default-pool executor that loads the pool tools
    (so they are registered), but no executor of pool ``acme``."""
    home: Path = tmp_path_factory.mktemp("pools")
    local = fleet_settings(settings, home, policy=POLICY, tool_modules="tests.support.pool_tools")
    services = ("policy", "executor", "validator", "status")
    async with in_process_fleet(local, services) as running:
        redis = connect_redis(local.redis_url)
        try:
            # Policy's view of the pools is refreshed every second: wait for the executor.
            async def announced() -> bool:
                live = await live_executors(redis, topic_prefix=local.topic_prefix)
                return live.get("default", 0) >= 1

            await eventually(announced, timeout=30)
        finally:
            await redis.aclose()
        yield running


@contextlib.asynccontextmanager
async def acme_executor(fleet: Fleet) -> AsyncIterator[None]:
    """An executor started for pool ``acme`` (``--pool acme``), in this process."""
    values = fleet.settings.model_dump(exclude_unset=True)
    pooled = ExecutorSettings(**values, executor_pools="acme")
    async with running_services(pooled, ["executor"]):
        yield


async def row(fleet: Fleet, tenant: str, invocation_id: str) -> dict[str, Any] | None:
    """The call's status and execution metadata in the projection (what the API serves)."""
    conn = await asyncpg.connect(fleet.settings.database_url)
    try:
        found = await conn.fetchrow(
            "SELECT status, execution_metadata::text AS meta FROM tool_invocations"
            " WHERE tenant_id = $1 AND invocation_id = $2",
            tenant,
            uuid.UUID(invocation_id),
        )
    finally:
        await conn.close()
    if found is None:
        return None
    return {"status": found["status"], "execution_metadata": json.loads(found["meta"] or "null")}


async def read_topic(fleet: Fleet, name: str) -> list[Envelope]:
    """Everything on topic ``name`` so far."""
    consumer = AIOKafkaConsumer(
        name, **connection_kwargs(fleet.settings), auto_offset_reset="earliest"
    )
    await consumer.start()
    found: list[Envelope] = []
    try:
        while batch := await consumer.getmany(timeout_ms=300):
            for records in batch.values():
                found += [
                    decode(key=r.key, value=r.value, headers=list(r.headers)) for r in records
                ]
    finally:
        await consumer.stop()
    return found


async def forged_call_is_refused(fleet: Fleet, pool: str, tool_id: str) -> None:
    """Write an authorized event with a grant policy never signed straight to ``pool``'s
    topic (whose executor has ``tool_id``): it must end ``permission_denied``, unrun."""
    tenant = "t_pool_forger"
    data = InvokeAuthorized(
        invocation_id=uuid.uuid4(),
        tool_id=tool_id,
        tool_version="1.0.0",
        requested_version="*",
        agent_context=AgentContext(agent_did=AGENT, tenant_id=tenant),
        parameters={"city": "Forged"},
        effect=Effect.READ_ONLY,
        timeout_seconds=5,
        requested_at=datetime.now(UTC),
        pool=pool,
        grant="eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.Zm9yZ2Vk",
    )
    forged = new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data=data,
        tenant_id=tenant,
        invocation_id=str(data.invocation_id),
    )
    handle = fleet.client.expect(str(data.invocation_id), tenant_id=tenant)
    topic = pool_topic(fleet.settings.topic_prefix, pool)
    await fleet.producer.send(Outbound(envelope=forged, topic=topic))
    outcome = await fleet.client.wait(handle, timeout=30)
    assert outcome.status is InvocationStatus.PERMISSION_DENIED
    assert outcome.error is not None
    assert outcome.error.code == ErrorCode.PERMISSION_DENIED
    assert outcome.result is None


async def invoke(fleet: Fleet, tool: str, params: dict[str, Any], tenant: str) -> Any:
    return await fleet.client.invoke(
        tool,
        params,
        tenant_id=tenant,
        agent_did=AGENT,
        capability_token=fleet.token(tenant, AGENT),
    )


async def test_a_pool_call_waits_queued_for_its_pool_and_forgeries_there_run_nothing(
    fleet: Fleet,
) -> None:
    tenant = "t_pool_queue"
    handle = await invoke(fleet, "acme__weather", {"city": "Oslo"}, tenant)

    async def queued() -> dict[str, Any] | None:
        found = await row(fleet, tenant, handle.invocation_id)
        return found if found and found["status"] == "queued" else None

    waiting = await eventually(queued, timeout=30)
    assert waiting["execution_metadata"] == {"pool": "acme"}
    on_pool = await read_topic(fleet, pool_topic(fleet.settings.topic_prefix, "acme"))
    assert [e.invocationid for e in on_pool] == [handle.invocation_id]
    default = await fleet.read(TopicName.AUTHORIZED, invocation_id=handle.invocation_id)
    assert default == []  # never on the default pool's topic

    async with acme_executor(fleet):
        outcome = await fleet.client.wait(handle, timeout=30)
        await forged_call_is_refused(fleet, "acme", "acme__weather")
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result is not None
    assert outcome.result["forecast"] == "sunny"

    async def ended() -> dict[str, Any] | None:
        found = await row(fleet, tenant, handle.invocation_id)
        return found if found and found["status"] == "success" else None

    done = await eventually(ended, timeout=30)
    assert done["execution_metadata"]["pool"] == "acme"

    # Status started before the pool's topic existed and still read it (a pattern
    # subscription finds new topics and reads them from their start).
    async def authorized_seen() -> bool:
        conn = await asyncpg.connect(fleet.settings.database_url)
        try:
            kinds = await conn.fetch(
                "SELECT event_kind FROM projected_events WHERE invocation_id = $1",
                uuid.UUID(handle.invocation_id),
            )
        finally:
            await conn.close()
        return "authorized" in {k["event_kind"] for k in kinds}

    assert await eventually(authorized_seen, timeout=30)


async def test_a_tenant_cannot_pick_a_pool_in_its_request(fleet: Fleet) -> None:
    tenant = "t_pool_picker"
    request = invoke_request(
        "core__echo",
        {"message": "to the gpu pool please"},
        tenant_id=tenant,
        agent_did=AGENT,
        capability_token=fleet.token(tenant, AGENT),
    )
    data = {**request.model_dump(mode="json"), "pool": "acme"}
    event = new_event(
        event_type=EventType.INVOKE_REQUESTED,
        source=Source.CLIENT,
        data=data,
        tenant_id=tenant,
        invocation_id=str(request.invocation_id),
    )
    handle = fleet.client.expect(str(request.invocation_id), tenant_id=tenant)
    await fleet.publish(event)
    outcome = await fleet.client.wait(handle, timeout=30)
    assert outcome.status is InvocationStatus.ERROR
    assert outcome.error is not None
    assert outcome.error.code == ErrorCode.INVALID_EVENT
    on_pool = await read_topic(fleet, pool_topic(fleet.settings.topic_prefix, "acme"))
    assert str(request.invocation_id) not in {e.invocationid for e in on_pool}
