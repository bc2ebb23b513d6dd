"""The executor's scheduling on the real broker: priority, fairness, at-least-once.

The executor reads ahead into a backlog and starts calls by priority, round-robin over
tenants, each tenant within ``max_in_flight_per_tenant``. ``test__ordered`` records the
order calls start in and holds until the test opens its gate.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from tests.support import sample_tools
from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from tests.support.sample_tools import STARTED
from toolfleet.bus.admin import ensure_topics
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.bus.runtime import ConsumerSpec, EventConsumer, Inbound
from toolfleet.bus.scheduler import Placement
from toolfleet.client import InvocationHandle
from toolfleet.devstack.broker_profile import DevBrokerProfile
from toolfleet.events.codec import ContentMode, encode
from toolfleet.events.envelope import new_event
from toolfleet.events.models import InvocationStatus, Priority
from toolfleet.events.types import EventType, Source, TopicName, topic
from toolfleet.executor.settings import ExecutorSettings
from toolfleet.settings import FleetSettings
from toolfleet.worker import load_build, open_resources

pytestmark = pytest.mark.integration

AGENT = "did:agent:test"
assert sample_tools.ordered  # the tool these tests drive


@contextlib.asynccontextmanager
async def fleet_with_executor(
    settings: FleetSettings, home: Path, **executor: Any
) -> AsyncIterator[tuple[Fleet, EventConsumer]]:
    """Policy and validator as usual, plus an executor with ``executor`` settings whose
    ``invoke.authorized`` consumer the test can look at."""
    local = fleet_settings(settings, home)
    executor_settings = ExecutorSettings(**local.model_dump(exclude_unset=True), **executor)
    async with (
        in_process_fleet(local, services=("policy", "validator")) as fleet,
        open_resources(executor_settings, service="executor") as res,
    ):
        consumers = await load_build("executor")(res)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(c.run(stop)) for c in consumers]
        tasks += [asyncio.create_task(job(stop)) for job in res.jobs]
        try:
            await asyncio.wait_for(asyncio.gather(*(c.assigned.wait() for c in consumers)), 60)
            executions = next(c for c in consumers if c.spec.service == "executor")
            yield fleet, executions
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)


async def invoke(
    fleet: Fleet, tenant: str, params: dict[str, Any], priority: Priority = Priority.NORMAL
) -> InvocationHandle:
    return await fleet.client.invoke(
        "test__ordered",
        params,
        tenant_id=tenant,
        agent_did=AGENT,
        capability_token=fleet.token(tenant),
        priority=priority,
    )


async def succeeded(fleet: Fleet, handles: Sequence[InvocationHandle]) -> None:
    outcomes = await asyncio.gather(*(fleet.client.wait(h, timeout=30) for h in handles))
    assert [o.status for o in outcomes] == [InvocationStatus.SUCCESS] * len(handles)


async def test_a_high_priority_call_starts_before_queued_lower_ones(
    settings: FleetSettings, tmp_path: Path
) -> None:
    run, gate = uuid.uuid4().hex, uuid.uuid4().hex
    async with fleet_with_executor(settings, tmp_path, max_in_flight=1) as (fleet, executor):
        # One slot, taken by a call that holds until the gate opens.
        blocker = await invoke(fleet, "t1", {"run": run, "label": "blocker", "gate": gate})
        await eventually(lambda: _async(STARTED.get(run) == ["blocker"]), timeout=30)
        queued = [
            ("low", Priority.LOW),
            ("normal", Priority.NORMAL),
            ("low", Priority.LOW),
            ("normal", Priority.NORMAL),
            ("high", Priority.HIGH),  # published last, on the same tenant and partition
        ]
        handles = [
            await invoke(fleet, "t1", {"run": run, "label": label}, priority)
            for label, priority in queued
        ]
        await eventually(lambda: _async(executor.queued == len(queued)), timeout=30)
        assert STARTED[run] == ["blocker"]
        sample_tools.gate(gate).set()
        await succeeded(fleet, [blocker, *handles])
    assert STARTED[run] == ["blocker", "high", "normal", "normal", "low", "low"]


async def test_one_tenants_backlog_does_not_hold_up_another_tenant(
    settings: FleetSettings, tmp_path: Path
) -> None:
    run, gate = uuid.uuid4().hex, uuid.uuid4().hex
    async with fleet_with_executor(
        settings, tmp_path, max_in_flight=8, max_in_flight_per_tenant=2
    ) as (fleet, executor):
        # Tenant A floods the worker with calls that hold until the gate opens...
        flood = [
            await invoke(fleet, "t_a", {"run": run, "label": "a", "gate": gate}) for _ in range(12)
        ]
        await eventually(
            lambda: _async(STARTED.get(run) == ["a", "a"] and executor.queued == 10), timeout=30
        )
        # ...yet B's one call runs at once: A is at its bound, six slots are free.
        quick = await invoke(fleet, "t_b", {"run": run, "label": "b"})
        outcome = await fleet.client.wait(quick, timeout=15)
        assert outcome.status is InvocationStatus.SUCCESS
        assert STARTED[run] == ["a", "a", "b"]
        assert executor.queued == 10  # A's backlog has not moved
        sample_tools.gate(gate).set()
        await succeeded(fleet, flood)
    assert STARTED[run].count("a") == 12


async def test_queued_records_are_left_to_the_next_owner_and_bad_ones_dead_lettered_at_once(
    settings: FleetSettings,
) -> None:
    prefix = f"{settings.topic_prefix}sc{uuid.uuid4().hex[:6]}."
    local = settings.model_copy(update={"topic_prefix": prefix})
    await ensure_topics(local)
    requested = topic(prefix, TopicName.REQUESTED)
    group = f"g-{uuid.uuid4().hex[:6]}"
    handled: list[tuple[str, str]] = []  # (consumer, event id)
    gate = asyncio.Event()

    def consumer(name: str, producer: EventProducer) -> EventConsumer:
        async def handler(event: Inbound) -> Sequence[Outbound]:
            handled.append((name, event.envelope.id))
            await gate.wait()
            return []

        spec = ConsumerSpec(
            service="test",
            source="/toolfleet/test",
            group_id=group,
            topics=[requested],
            max_in_flight=1,
            schedule=lambda env: Placement(int(env.data["rank"]), env.tenantid or ""),
        )
        return EventConsumer(
            spec,
            handler,
            settings=local,
            producer=producer,
            processed=None,
            dlq_topic=topic(prefix, TopicName.DLQ),
            profile=DevBrokerProfile(local),
        )

    events = [
        new_event(
            event_type=EventType.INVOKE_REQUESTED,
            source=Source.CLI,
            data={"rank": rank},
            tenant_id="t1",  # one key: one partition, in this order
            invocation_id=str(uuid.uuid4()),
        )
        for rank in (1, 1, 0, 1)
    ]
    producer = EventProducer(local)
    await producer.start()
    raw = AIOKafkaProducer(**connection_kwargs(local))
    await raw.start()
    try:
        for env in events[:1]:
            wire = encode(env, ContentMode.BINARY)
            await raw.send_and_wait(requested, wire.value, key=wire.key, headers=wire.headers)
        first = consumer("first", producer)
        stop_first = asyncio.Event()
        running = asyncio.create_task(first.run(stop_first))
        await eventually(lambda: _async(handled == [("first", events[0].id)]), timeout=30)
        await raw.send_and_wait(requested, b"\x00garbage", key=b"t1", headers=[("x", b"y")])
        for env in events[1:]:
            wire = encode(env, ContentMode.BINARY)
            await raw.send_and_wait(requested, wire.value, key=wire.key, headers=wire.headers)
        await eventually(lambda: _async(first.queued == 3), timeout=30)
        # The undecodable record did not wait for the busy slot: it is dead-lettered now.
        dlq = await _read(local, topic(prefix, TopicName.DLQ), want=1)
        assert dlq[0].value is not None

        # Stop while three records are queued: the running one finishes, none starts.
        stop_first.set()
        gate.set()
        await running
        assert handled == [("first", events[0].id)]

        # The next consumer of the group reads exactly the queued ones.
        second = consumer("second", producer)
        stop_second = asyncio.Event()
        running = asyncio.create_task(second.run(stop_second))
        try:
            await eventually(lambda: _async(len(handled) == 4), timeout=30)
        finally:
            stop_second.set()
            await running
    finally:
        await raw.stop()
        await producer.stop()
    assert handled[0] == ("first", events[0].id)
    assert sorted(handled[1:]) == sorted(("second", env.id) for env in events[1:])


async def _async(value: bool) -> bool:
    return value


async def _read(settings: FleetSettings, name: str, *, want: int) -> list[Any]:
    from aiokafka import AIOKafkaConsumer

    reader = AIOKafkaConsumer(
        name,
        **connection_kwargs(settings),
        auto_offset_reset="earliest",
        fetch_max_wait_ms=5,
    )
    await reader.start()
    got: list[Any] = []
    try:

        async def more() -> bool:
            batch = await reader.getmany(timeout_ms=100)
            for records in batch.values():
                got.extend(records)
            return len(got) >= want

        await eventually(more, timeout=15)
    finally:
        await reader.stop()
    return got
