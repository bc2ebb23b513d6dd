"""A zombie executor: paused past its lease, replaced, then woken up.

Two executors as processes. The one running a long invocation gets SIGSTOP; its Kafka
session and its lease lapse, the other executor takes the invocation over under the
next epoch and resumes from the last checkpoint. Then the zombie gets SIGCONT and its
tool carries on where it was frozen: every write it tries is refused by the store, so
no checkpoint of it appears and exactly one outcome, the successor's, is published.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.eventually import eventually
from tests.support.fleet import ProcessFleet, process_fleet
from tests.support.groups import group_formed
from tests.support.pipeline import Fleet, fleet_settings
from toolfleet.client import Progress
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import InvocationStatus
from toolfleet.events.types import EventType, TopicName
from toolfleet.settings import FleetSettings

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

AGENT = "did:agent:zombie"
STEPS = 16


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Fleet, ProcessFleet]]:
    home: Path = tmp_path_factory.mktemp("zombie")
    # The lease TTL follows the session timeout: both lapse 3 s after the pause.
    local = fleet_settings(settings, home, session_timeout_ms=3000)
    # JSON logs carry a timestamp each: a failure shows when the zombie did what.
    async with process_fleet(
        local, home, TOOLFLEET_LOG_LEVEL="INFO", TOOLFLEET_LOG_FORMAT="json"
    ) as running:
        fleet, procs = running
        procs.start("executor")
        # Both executors in the group before the call: were the second to join later, the
        # rebalance would hand the call over at a checkpoint, and the "zombie" paused
        # then would hold nothing to lose.
        await group_formed(local, f"{local.topic_prefix}executor", members=2, stable=True)
        yield fleet, procs


def _starts(events: list[Envelope]) -> list[Envelope]:
    return [e for e in events if e.type == EventType.INVOKED]


def _process_of(procs: ProcessFleet, worker_id: str) -> subprocess.Popen[bytes]:
    pid = int(worker_id.rsplit("-", 1)[1])
    (proc,) = [p for p in procs.procs["executor"] if p.pid == pid]
    return proc


async def test_a_woken_zombie_cannot_write_a_checkpoint_or_an_outcome(
    fleet: tuple[Fleet, ProcessFleet],
) -> None:
    running, procs = fleet
    seen: list[Progress] = []
    handle = await running.client.invoke(
        "core__long_running",
        {"steps": STEPS, "step_seconds": 0.5},
        tenant_id="t-zombie",
        agent_did=AGENT,
        capability_token=running.token("t-zombie", AGENT),
    )
    waiting = asyncio.create_task(running.client.wait(handle, timeout=150, on_progress=seen.append))

    async def two_steps_done() -> bool:
        return any((p.progress_percent or 0) >= 200 / STEPS for p in seen)

    await eventually(two_steps_done, timeout=60)
    events = await running.read(TopicName.EVENTS, invocation_id=handle.invocation_id)
    (first,) = _starts(events)
    zombie = _process_of(procs, first.data["worker_id"])
    zombie.send_signal(signal.SIGSTOP)
    try:

        async def taken_over() -> list[Envelope] | None:
            starts = _starts(
                await running.read(TopicName.EVENTS, invocation_id=handle.invocation_id)
            )
            return starts if len(starts) >= 2 else None

        starts = await eventually(taken_over, timeout=60)
        successor = starts[-1]
        assert successor.data["worker_id"] != first.data["worker_id"]
        assert successor.data["resumed_from_checkpoint_id"] is not None
        await asyncio.sleep(1.5)  # the successor checkpoints a step or two meanwhile
    finally:
        zombie.send_signal(signal.SIGCONT)

    outcome = await waiting
    assert outcome.status is InvocationStatus.SUCCESS, procs.logs()
    assert outcome.result is not None
    assert outcome.result["steps_completed"] == STEPS
    assert outcome.result["resumed_from_step"] >= 2

    # Give the woken zombie time to try its late writes, then look at what got out.
    try:
        await eventually(lambda: _logged(procs, "lease lost"), timeout=30)
    except AssertionError:
        raise AssertionError(f"the woken zombie logged no refused write\n{procs.logs()}") from None
    await running.client.call(
        "core__echo",
        {"message": "after the zombie woke"},
        tenant_id="t-zombie",
        agent_did=AGENT,
        capability_token=running.token("t-zombie", AGENT),
        timeout=60,
    )
    results = await running.read(TopicName.RESULTS, invocation_id=handle.invocation_id)
    assert len({r.id for r in results}) == 1
    assert {r.type for r in results} == {EventType.SUCCEEDED}
    events = await running.read(TopicName.EVENTS, invocation_id=handle.invocation_id)
    progress = [
        e.data["progress_percent"] for e in events if e.type == EventType.CHECKPOINT_CREATED
    ]
    # A late checkpoint of the zombie would repeat a step the successor also saved.
    assert len(progress) == len(set(progress)), progress
    assert zombie.poll() is None  # refused, not crashed: the zombie serves on


async def _logged(procs: ProcessFleet, text: str) -> bool:
    logs = procs.log_dir.glob("executor-*.log")
    return any(text in log.read_text(errors="replace") for log in logs)
