"""A scripted three-turn agent through the real fleet (every service a process).

Turn 1 asks for five calls at once: two echoes, one echo whose arguments are broken
JSON, one ``test__sleep`` whose effect the tenant's policy sends to a human, and a
checkpointing ``core__long_running`` whose progress reaches the run's event stream. The
approval is given through the API by an approver, the broken call comes back to the
model as an error and turn 2 corrects it; turn 3 is the model's answer. The loop then
crashes before its last turn and is run again from the start: every call finds its
first outcome through its idempotency key and no tool runs twice. The bundle of the
re-run replays to the same run with no model and no fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.support.eventually import eventually
from tests.support.fleet import ProcessFleet, process_fleet
from tests.support.pipeline import Fleet, fleet_settings
from toolfleet.agent import (
    AgentEvent,
    BundleHeader,
    BundleWriter,
    EventKind,
    HttpFleet,
    KafkaFleet,
    ModelRequest,
    OpenAIChat,
    ToolRunner,
    read_bundle,
    replay,
    run_agent,
)
from toolfleet.agent.port import FleetPort
from toolfleet.api import ApiSettings, create_app
from toolfleet.events.types import EventType, TopicName
from toolfleet.settings import FleetSettings

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

TENANT = "t_approval"  # DEFAULT_POLICY: external_side_effect waits for a human
APPROVER = "did:user:alice"


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Fleet, ProcessFleet, FleetSettings]]:
    home: Path = tmp_path_factory.mktemp("e2e-agent")
    local = fleet_settings(settings, home)
    async with process_fleet(local, home) as (running, procs):
        yield running, procs, local


@pytest.fixture
async def api(
    fleet: tuple[Fleet, ProcessFleet, FleetSettings],
) -> AsyncIterator[httpx.AsyncClient]:
    _, _, local = fleet
    app: FastAPI = create_app(ApiSettings(**{**local.model_dump(), "api_url": "http://api.test"}))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
            yield client


def _chat(*calls: tuple[str, str, str], text: str = "") -> dict[str, Any]:
    tool_calls = [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
        for cid, name, args in calls
    ]
    message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls or None}
    return {"choices": [{"index": 0, "finish_reason": "stop", "message": message}]}


SCRIPT = [
    _chat(
        ("call_a", "core__echo", '{"message": "alpha"}'),
        ("call_b", "core__echo", '{"message": "beta"}'),
        ("call_c", "core__echo", '{"message": "gam'),
        ("call_d", "test__sleep", '{"seconds": 0.05}'),
        # Steps longer than the HTTP port's 0.2 s status polls, with the status worker's
        # lag on top: a poll lands between two checkpoints (at 0.1 s a step, the status
        # view could go from the first checkpoint to the outcome between two polls).
        ("call_f", "core__long_running", '{"steps": 3, "step_seconds": 0.5}'),
    ),
    _chat(("call_e", "core__echo", '{"message": "gamma"}')),
    _chat(text="alpha beta gamma, and I slept."),
]


async def _invoked(running: Fleet, agent: str) -> list[str]:
    """Invocation ids the executors started for this agent (a tool run twice shows)."""
    events = await running.read(TopicName.EVENTS)
    return [
        str(e.invocationid)
        for e in events
        if e.type == EventType.INVOKED and e.data.get("agent_did") == agent
    ]


@contextlib.asynccontextmanager
async def _port(
    transport: str, running: Fleet, api: httpx.AsyncClient, token: str, agent: str
) -> AsyncIterator[FleetPort]:
    """The fleet as the runner sees it, over the broker or over the HTTP API."""
    asgi = api._transport  # the app itself, as the API client's transport
    if transport == "kafka":
        async with KafkaFleet.open(
            running.settings,
            api_url="http://api.test",
            token=token,
            tenant_id=TENANT,
            agent_did=agent,
            transport=asgi,
        ) as port:
            yield port
    else:
        async with HttpFleet.open(
            "http://api.test", token=token, tenant_id=TENANT, agent_did=agent, transport=asgi
        ) as http_port:
            yield http_port


@pytest.mark.parametrize("transport", ["kafka", "http"])
async def test_a_scripted_agent_through_the_fleet(
    fleet: tuple[Fleet, ProcessFleet, FleetSettings],
    api: httpx.AsyncClient,
    tmp_path: Path,
    transport: str,
) -> None:
    running, procs, _ = fleet
    agent = f"did:agent:scripted-{transport}"
    token = running.token(TENANT, agent)
    approver = running.issuer.issue(
        tenant_id=TENANT, agent_did=APPROVER, tool_id="*", scopes=["approver"]
    )
    stack = contextlib.AsyncExitStack()
    port = await stack.enter_async_context(_port(transport, running, api, token, agent))
    try:
        run_id = f"run-{uuid.uuid4().hex[:8]}"
        approvals: list[asyncio.Task[None]] = []

        async def approve(invocation_id: str) -> None:
            async def decided() -> bool:
                answer = await api.post(
                    f"/v1/invocations/{invocation_id}/approve",
                    headers={"Authorization": f"Bearer {approver}"},
                )
                assert answer.status_code == 200, answer.text  # 404/409 until status catches up
                return True

            await eventually(decided, timeout=30)

        events: list[AgentEvent] = []

        def heard(event: AgentEvent) -> None:
            events.append(event)
            if event.kind is EventKind.APPROVAL_PENDING and event.invocation_id:
                approvals.append(asyncio.create_task(approve(event.invocation_id)))

        crash = {"armed": True}

        async def model(request: ModelRequest) -> dict[str, Any]:
            if request.turn == 2 and crash.pop("armed", False):
                raise RuntimeError("the agent's process died")
            return SCRIPT[request.turn]

        async def attempt(bundle: Path) -> Any:
            runner = await ToolRunner.open(port, run_id=run_id)
            runner.subscribe(heard)
            writer = BundleWriter(
                bundle,
                BundleHeader.of(runner, OpenAIChat()),
            )
            try:
                return await run_agent(
                    model,
                    runner=runner,
                    adapter=OpenAIChat(),
                    messages=[{"role": "user", "content": "echo three words, then nap"}],
                    recorder=writer,
                )
            finally:
                writer.close()

        with pytest.raises(RuntimeError, match="died"):
            await attempt(tmp_path / "first.jsonl")
        await asyncio.gather(*approvals)
        assert len(approvals) == 1, "exactly one call waited for a human"
        first_runs = await eventually(_invoked_all(running, agent, 5), timeout=30)
        progress = [e for e in events if e.kind is EventKind.PROGRESS]
        assert progress, "the long call's checkpoints reach the run as progress"
        assert all(e.tool == "core__long_running" for e in progress), [
            (e.tool, e.current_phase, e.progress_percent) for e in progress
        ]
        percents = [e.progress_percent or 0 for e in progress]
        assert percents == sorted(percents)
        assert 0 < percents[-1] <= 100

        rerun = await attempt(tmp_path / "rerun.jsonl")
        assert rerun.stopped == "done", procs.logs()
        assert rerun.text == "alpha beta gamma, and I slept."
        statuses = [
            (rerun.tools_by_id[c].tool, rerun.tools_by_id[c].status) for c in rerun.tool_order
        ]
        assert statuses == [
            ("core__echo", "success"),
            ("core__echo", "success"),
            ("core__echo", "error"),
            ("test__sleep", "success"),
            ("core__long_running", "success"),
            ("core__echo", "success"),
        ]
        outputs = [rerun.tools_by_id[c].output for c in rerun.tool_order]
        assert outputs[0] == {"message": "alpha", "length": 5}
        assert outputs[1] == {"message": "beta", "length": 4}
        assert outputs[4] == {"steps_completed": 3, "resumed_from_step": None}
        assert outputs[5] == {"message": "gamma", "length": 5}
        invalid = rerun.tools_by_id[rerun.tool_order[2]]
        assert invalid.invocation_id is None  # never reached the fleet
        assert invalid.error is not None
        assert "not valid JSON" in invalid.error.message
        assert len(approvals) == 1, "the re-run found the approved call's outcome"
        # No tool ran twice: the re-run's calls are duplicates of the first run's.
        assert sorted(await _invoked(running, agent)) == sorted(first_runs)
        assert all(e.trace_id for e in rerun.tools_by_id.values() if e.invocation_id)

        report = await replay(read_bundle(tmp_path / "rerun.jsonl"))
        assert report.calls == 6
        assert report.reproduced, [str(d) for d in report.divergences]

    finally:
        await stack.aclose()


def _invoked_all(running: Fleet, agent: str, count: int) -> Any:
    async def check() -> list[str] | None:
        found = await _invoked(running, agent)
        assert len(found) == count, found
        return found

    return check
