"""Hostile tools through the whole fleet (every service a process): each call ends with
its typed outcome, the executor keeps serving, and the token's filesystem permission
travels policy -> signed grant -> sandbox."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fleet import ProcessFleet, process_fleet
from tests.support.pipeline import DEFAULT_POLICY, Fleet, fleet_settings
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.settings import FleetSettings

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

AGENT = "did:agent:e2e-iso"
TENANT = "t1"
POLICY = {"tenants": {"*": {"allow_tools": ["core__*", "test__*", "hostile__*"]}}}


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Fleet, ProcessFleet]]:
    assert DEFAULT_POLICY  # the default one does not name hostile__*
    home: Path = tmp_path_factory.mktemp("e2e-isolation")
    local = fleet_settings(
        settings,
        home,
        policy=POLICY,
        tool_modules="tests.support.sample_tools,tests.support.hostile_tools",
    )
    async with process_fleet(local, home, TOOLFLEET_ISOLATION_WARM_SANDBOXES="2") as running:
        yield running


async def call(running: Fleet, tool_id: str, params: dict[str, Any], **token: Any) -> ToolOutcome:
    return await running.client.call(
        tool_id,
        params,
        tenant_id=TENANT,
        agent_did=AGENT,
        capability_token=running.token(TENANT, AGENT, **token),
        timeout=90,
    )


def code(outcome: ToolOutcome) -> str:
    return "success" if outcome.error is None else str(outcome.error.code)


async def test_hostile_tools_end_typed_and_the_fleet_keeps_serving(
    fleet: tuple[Fleet, ProcessFleet],
) -> None:
    running, procs = fleet
    busy, hog, crash, echo = await asyncio.gather(
        call(running, "hostile__busy_loop", {}),
        call(running, "hostile__memory_hog", {}),
        call(running, "hostile__segfault", {}),
        call(running, "hostile__echo", {"text": "undisturbed"}),
    )
    assert code(busy) == "timeout", procs.logs()
    assert code(hog) == "resource_exhausted"
    assert code(crash) == "sandbox_failure"
    assert echo.status is InvocationStatus.SUCCESS
    assert echo.result == {"text": "undisturbed"}
    # It spun until its timeout: plausible CPU, at most two cores' worth of its run.
    busy_cpu = busy.execution_metadata.cpu_used_millicore_seconds
    assert 100 <= busy_cpu <= 2 * busy.execution_metadata.duration_ms + 500
    assert hog.execution_metadata.memory_peak_mb >= 100
    assert echo.execution_metadata.cpu_used_millicore_seconds > 0
    assert 5 < echo.execution_metadata.memory_peak_mb < 200
    after = await call(running, "core__echo", {"message": "still here"})
    assert after.status is InvocationStatus.SUCCESS
    assert after.execution_metadata.cpu_used_millicore_seconds == 0  # isolation="none"


async def test_run_python_runs_in_a_sandbox(fleet: tuple[Fleet, ProcessFleet]) -> None:
    running, _ = fleet
    ran = await call(running, "core__run_python", {"code": "print(6 * 7)"})
    assert ran.status is InvocationStatus.SUCCESS
    assert ran.result == {"stdout": "42\n", "stderr": "", "exit_code": 0}


async def test_the_tokens_filesystem_permission_reaches_the_sandbox(
    fleet: tuple[Fleet, ProcessFleet], tmp_path: Path
) -> None:
    running, _ = fleet
    tmp_path.chmod(0o755)  # noqa: ASYNC240 (test setup)
    data = tmp_path / "data.txt"
    data.write_text("granted")
    data.chmod(0o644)
    params = {"path": str(data)}
    denied = await call(running, "hostile__read_file", params)
    assert code(denied) == "tool_execution_error"
    granted = await call(
        running, "hostile__read_file", params, filesystem_permissions=[str(tmp_path)]
    )
    assert granted.status is InvocationStatus.SUCCESS
    assert granted.result == {"text": "granted"}
