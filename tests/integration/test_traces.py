"""A request published without ``traceparent`` still makes one trace, on every topic.

The whole pipeline (policy, executor, validator, audit, status) in-process on the real
broker, Redis and Postgres; a producer publishes ``invoke.requested`` bare, as the
contract allows, and everything the fleet publishes and stores about it is read back.
"""

from __future__ import annotations

import base64
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.events.codec import ContentMode, encode
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.identity import trace_id_of
from toolfleet.events.models import AgentContext, InvocationStatus, InvokeRequested
from toolfleet.events.types import LIFECYCLE_TOPICS, EventType, TopicName
from toolfleet.settings import FleetSettings
from toolfleet.status.store import PostgresProjection
from toolfleet.storage.postgres import create_pool

pytestmark = pytest.mark.integration

TENANT = "t-trace"
AGENT = "did:agent:trace"
STEPS = 2


@dataclass
class TracedFleet:
    fleet: Fleet
    projection: PostgresProjection


@pytest.fixture(scope="module")
async def traced(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[TracedFleet]:
    home: Path = tmp_path_factory.mktemp("traces")
    local = fleet_settings(settings, home)
    services = ("policy", "executor", "validator", "audit", "status")
    async with contextlib.AsyncExitStack() as stack:
        fleet = await stack.enter_async_context(in_process_fleet(local, services))
        pool = await create_pool(local.database_url)
        stack.push_async_callback(pool.close)
        yield TracedFleet(fleet=fleet, projection=PostgresProjection(pool))


def _bare_request(fleet: Fleet) -> Envelope:
    invocation_id = str(uuid.uuid4())
    request = InvokeRequested(
        invocation_id=uuid.UUID(invocation_id),
        tool_id="core__long_running",
        agent_context=AgentContext(agent_did=AGENT, tenant_id=TENANT),
        parameters={"steps": STEPS, "step_seconds": 0.05},
        capability_token=fleet.token(TENANT, AGENT),
    )
    return new_event(
        event_type=EventType.INVOKE_REQUESTED,
        source="/agents/bare-producer",
        data=request.model_dump(mode="json"),
        tenant_id=TENANT,
        invocation_id=invocation_id,
    )


async def _read_until(
    fleet: Fleet, name: TopicName, invocation_id: str, wanted: set[str]
) -> list[Envelope]:
    """Every event of ``name`` about ``invocation_id``, once its types include ``wanted``."""
    found: list[Envelope] = []

    async def complete() -> bool:
        found[:] = await fleet.read(name, invocation_id=invocation_id)
        return wanted <= {e.type for e in found}

    await eventually(complete, timeout=30)
    return found


async def test_a_request_without_traceparent_is_one_trace_everywhere(
    traced: TracedFleet,
) -> None:
    fleet = traced.fleet
    request = _bare_request(fleet)
    assert request.traceparent is None
    invocation_id = request.invocationid
    assert invocation_id is not None
    handle = fleet.client.expect(invocation_id, tenant_id=TENANT)
    await fleet.publish(request)
    outcome = await fleet.client.wait(handle, timeout=60)
    assert outcome.status is InvocationStatus.SUCCESS

    produced: list[Envelope] = []
    for name in LIFECYCLE_TOPICS:
        produced += await fleet.read(name, invocation_id=invocation_id)
    produced = [e for e in produced if e.id != request.id]
    types = {e.type for e in produced}
    assert {
        EventType.INVOKE_AUTHORIZED,
        EventType.INVOKED,
        EventType.CHECKPOINT_CREATED,
        EventType.INVOKE_EXECUTED,
        EventType.SUCCEEDED,
    } <= types
    trace_ids = {trace_id_of(e.traceparent) for e in produced}
    assert len(trace_ids) == 1, trace_ids
    (trace_id,) = trace_ids
    assert trace_id is not None

    # Audit records every event of the call, the bare request included, in that trace.
    audited = await _read_until(
        fleet,
        TopicName.AUDIT,
        invocation_id,
        {str(EventType.INVOKE_REQUESTED), *types},
    )
    assert {trace_id_of(e.traceparent) for e in audited} == {trace_id}
    assert {e.data["trace_id"] for e in audited} == {trace_id}

    # The status projection names the same trace.
    async def projected_trace() -> str | None:
        row = await traced.projection.get(invocation_id)
        return row.trace_id if row is not None and row.status == "success" else None

    assert await eventually(projected_trace, timeout=30) == trace_id


async def test_an_undecodable_message_is_dead_lettered_in_its_trace(traced: TracedFleet) -> None:
    fleet = traced.fleet
    traceparent = f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01"
    wire = encode(_bare_request(fleet), ContentMode.BINARY)
    headers = [(k, v) for k, v in wire.headers if k != "ce_traceparent"]
    headers.append(("ce_traceparent", traceparent.encode()))
    raw = AIOKafkaProducer(bootstrap_servers=fleet.settings.kafka_bootstrap)
    await raw.start()
    try:
        # ``data`` must be a JSON object: a list makes the message invalid, not its trace.
        await raw.send_and_wait(
            fleet.topic(TopicName.REQUESTED), b"[1, 2]", key=wire.key, headers=headers
        )
    finally:
        await raw.stop()

    def carried(record: Envelope) -> bool:
        return any(
            base64.b64decode(h["value_b64"]) == traceparent.encode() for h in record.data["headers"]
        )

    async def dead_lettered() -> list[Envelope]:
        return [r for r in await fleet.read(TopicName.DLQ) if carried(r)]

    records = await eventually(dead_lettered, timeout=30)
    assert {trace_id_of(r.traceparent) for r in records} == {trace_id_of(traceparent)}
