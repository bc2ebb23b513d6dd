"""The fleet as separate processes: crash, resume, DLQ, exactly one outcome."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaProducer

from tests.support.eventually import eventually
from tests.support.fleet import ProcessFleet, process_fleet
from tests.support.pipeline import Fleet, fleet_settings
from toolfleet.bus.connection import connection_kwargs
from toolfleet.client import Progress
from toolfleet.events.models import InvocationStatus
from toolfleet.events.types import EventType, TopicName
from toolfleet.settings import FleetSettings

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

AGENT = "did:agent:e2e"


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Fleet, ProcessFleet]]:
    home: Path = tmp_path_factory.mktemp("e2e")
    local = fleet_settings(settings, home, session_timeout_ms=6000)
    async with process_fleet(local, home, TOOLFLEET_LOG_LEVEL="INFO") as running:
        yield running


async def _status_of(database_url: str, invocation_id: str) -> str | None:
    conn = await asyncpg.connect(database_url)
    try:
        status: str | None = await conn.fetchval(
            "SELECT status FROM tool_invocations WHERE invocation_id = $1::uuid", invocation_id
        )
        return status
    finally:
        await conn.close()


async def test_kill_9_mid_run_resumes_from_checkpoint_on_a_fresh_executor(
    fleet: tuple[Fleet, ProcessFleet],
) -> None:
    running, procs = fleet
    seen: list[Progress] = []
    handle = await running.client.invoke(
        "core__long_running",
        {"steps": 20, "step_seconds": 0.25},
        tenant_id="t1",
        agent_did=AGENT,
        capability_token=running.token("t1", AGENT),
    )
    waiting = asyncio.create_task(running.client.wait(handle, timeout=120, on_progress=seen.append))

    async def some_progress() -> bool:
        return any((p.progress_percent or 0) >= 20 for p in seen)

    await eventually(some_progress, timeout=60)
    executor = procs.procs["executor"][0]
    procs.kill(executor, signal.SIGKILL)
    killed_at = max(p.progress_percent or 0 for p in seen)
    procs.start("executor")

    outcome = await waiting
    assert outcome.status is InvocationStatus.SUCCESS, procs.logs()
    assert outcome.result is not None
    resumed_from = outcome.result["resumed_from_step"]
    assert resumed_from is not None
    assert resumed_from >= 20 * killed_at / 100
    assert outcome.execution_metadata.resumed_from_checkpoint_id is not None

    # exactly one terminal outcome, even after the crash and the redelivery
    await running.client.call(
        "core__echo",
        {"message": "sentinel"},
        tenant_id="t1",
        agent_did=AGENT,
        capability_token=running.token("t1", AGENT),
        timeout=60,
    )
    results = await running.read(TopicName.RESULTS, invocation_id=handle.invocation_id)
    assert len({r.id for r in results}) == 1
    assert [r.type for r in results] == [EventType.SUCCEEDED] * len(results)
    invoked = await running.read(TopicName.EVENTS, invocation_id=handle.invocation_id)
    starts = [e for e in invoked if e.type == EventType.INVOKED]
    assert len(starts) == 2  # the first run, then the resumed one
    assert starts[-1].data["resumed_from_checkpoint_id"]

    async def projected() -> bool:
        return await _status_of(running.settings.database_url, handle.invocation_id) == "success"

    await eventually(projected, timeout=30)


async def test_garbage_goes_to_the_dlq_and_the_fleet_keeps_consuming(
    fleet: tuple[Fleet, ProcessFleet],
) -> None:
    running, _ = fleet
    raw = AIOKafkaProducer(**connection_kwargs(running.settings))
    await raw.start()
    try:
        await raw.send_and_wait(
            running.topic(TopicName.REQUESTED),
            b"{not json",
            key=b"t1",
            headers=[("content-type", b"application/cloudevents+json")],
        )
    finally:
        await raw.stop()
    outcome = await running.client.call(
        "core__echo",
        {"message": "still alive"},
        tenant_id="t1",
        agent_did=AGENT,
        capability_token=running.token("t1", AGENT),
        timeout=60,
    )
    assert outcome.status is InvocationStatus.SUCCESS

    async def dead_lettered() -> bool:
        records = await running.read(TopicName.DLQ)
        return any(r.data.get("value_b64") == "e25vdCBqc29u" for r in records)

    await eventually(dead_lettered, timeout=30)


async def test_sigterm_hands_a_running_tool_over_at_its_next_checkpoint(
    fleet: tuple[Fleet, ProcessFleet],
) -> None:
    running, procs = fleet
    handle = await running.client.invoke(
        "core__long_running",
        {"steps": 12, "step_seconds": 0.25},
        tenant_id="t2",
        agent_did=AGENT,
        capability_token=running.token("t2", AGENT),
    )
    seen: list[Progress] = []
    waiting = asyncio.create_task(running.client.wait(handle, timeout=90, on_progress=seen.append))

    async def a_step_done() -> bool:
        return any(p.event_type == EventType.CHECKPOINT_CREATED for p in seen)

    await eventually(a_step_done, timeout=60)
    executor = next(p for p in procs.procs["executor"] if p.poll() is None)
    executor.send_signal(signal.SIGTERM)
    # It stops at the next checkpoint, well before the 3 s the tool would still need.
    assert executor.wait(30) == 0
    assert not waiting.done()
    procs.start("executor")
    outcome = await waiting
    assert outcome.status is InvocationStatus.SUCCESS, procs.logs()
    assert outcome.result is not None
    assert outcome.result["steps_completed"] == 12
    assert 1 <= outcome.result["resumed_from_step"] < 12  # carried on, not restarted
    events = await running.read(TopicName.EVENTS, invocation_id=handle.invocation_id)
    progress = [
        e.data["progress_percent"] for e in events if e.type == EventType.CHECKPOINT_CREATED
    ]
    assert sorted(progress) == [100 * (i + 1) / 12 for i in range(12)]  # no step twice
