"""The agent runner on the in-memory fleet twin: what a model and its user see."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agent_fixtures import EchoIn, WeatherIn, manifest
from toolfleet.agent import (
    AgentEvent,
    AgentRunLimits,
    BundleHeader,
    BundleWriter,
    EventKind,
    MemoryFleet,
    ModelRequest,
    ModelTurn,
    OpenAIChat,
    ToolCall,
    ToolRunner,
    read_bundle,
    replay,
    run_agent,
)
from toolfleet.agent.adapters import parse_call, result_text
from toolfleet.events.models import Effect

pytestmark = pytest.mark.unit


def _fleet() -> MemoryFleet:
    fleet = MemoryFleet()

    async def echo(params: dict[str, Any]) -> dict[str, Any]:
        return {"value": params["message"]}

    async def weather(params: dict[str, Any]) -> dict[str, Any]:
        return {"value": f"sunny in {params['address']['city']}"}

    async def pay(params: dict[str, Any]) -> dict[str, Any]:
        return {"value": f"paid {params['message']}"}

    fleet.add_tool(manifest("core__echo", EchoIn), echo)
    fleet.add_tool(manifest("acme__weather", WeatherIn), weather)
    fleet.add_tool(
        manifest("acme__pay", EchoIn, effect="external_side_effect"), pay, needs_approval=True
    )
    return fleet


def _call(tool: str, raw: str, pid: str = "call_1") -> ToolCall:
    return parse_call(pid, tool, raw)


async def test_calls_outside_the_catalog_are_refused_without_touching_the_fleet() -> None:
    fleet = _fleet()
    runner = await ToolRunner.open(
        fleet,
        run_id="r1",
        limits=AgentRunLimits(denied_effects=frozenset({Effect.EXTERNAL_SIDE_EFFECT})),
    )
    assert runner.catalog.names == ["acme__weather", "core__echo"]  # the read-only agent
    envelopes = await runner.run_turn(
        0, [_call("core__shell", '{"cmd": "rm -rf /"}'), _call("acme__pay", '{"message": "1"}')]
    )
    assert [e.status for e in envelopes] == ["permission_denied", "permission_denied"]
    assert envelopes[0].error is not None
    assert "not in this run's catalog" in envelopes[0].error.message
    assert fleet.submissions == []


async def test_invalid_arguments_come_back_as_correctable_errors() -> None:
    fleet = _fleet()
    runner = await ToolRunner.open(fleet, run_id="r1")
    bad_json, bad_schema = await runner.run_turn(
        0,
        [
            _call("core__echo", '{"message": "hi"', "c1"),
            _call("acme__weather", '{"address": {"zip": "69001"}}', "c2"),
        ],
    )
    assert fleet.submissions == []
    for envelope in (bad_json, bad_schema):
        assert envelope.status == "error"
        assert envelope.error is not None
        assert envelope.error.code.value == "invalid_parameters"
    (message,) = OpenAIChat().result_messages([bad_schema])[:1]
    assert "address" in message["content"]
    assert "city" in message["content"]
    # The next turn corrects the call and it runs.
    (fixed,) = await runner.run_turn(1, [_call("core__echo", '{"message": "hi"}', "c3")])
    assert fixed.ok
    assert fixed.output == {"value": "hi"}


async def test_one_turn_runs_in_parallel_with_deterministic_ids() -> None:
    fleet = MemoryFleet()
    started: list[str] = []
    both = asyncio.Event()

    async def rendezvous(params: dict[str, Any]) -> dict[str, Any]:
        started.append(params["message"])
        if len(started) == 2:
            both.set()
        await asyncio.wait_for(both.wait(), 5)  # only returns if the other one runs too
        return {"value": params["message"]}

    fleet.add_tool(manifest("core__echo", EchoIn), rendezvous)
    calls = [
        _call("core__echo", '{"message": "a"}', "p1"),
        _call("core__echo", '{"message":"b"}', "p2"),
    ]
    runner = await ToolRunner.open(fleet, run_id="run-7")
    first = await runner.run_turn(0, calls)
    assert [e.output for e in first] == [{"value": "a"}, {"value": "b"}]
    assert [s.idempotency_key for s in fleet.submissions] == [e.call_id for e in first]
    # The same run, turn, index, tool and arguments (any key order) give the same id.
    again = await ToolRunner.open(fleet, run_id="run-7")
    second = await again.run_turn(
        0,
        [
            _call("core__echo", '{ "message" : "a" }', "x"),
            _call("core__echo", '{"message":"b"}', "y"),
        ],
    )
    assert [e.call_id for e in second] == [e.call_id for e in first]
    assert fleet.runs["core__echo"] == 2  # the re-run ran nothing
    other = await (await ToolRunner.open(fleet, run_id="run-8")).run_turn(0, calls[:1])
    assert other[0].call_id != first[0].call_id


async def test_an_approval_is_pending_not_failed() -> None:
    fleet = _fleet()
    runner = await ToolRunner.open(fleet, run_id="r1")
    events: list[AgentEvent] = []
    pending = asyncio.Event()

    def heard(event: AgentEvent) -> None:
        events.append(event)
        if event.kind is EventKind.APPROVAL_PENDING:
            pending.set()

    runner.subscribe(heard)
    task = asyncio.create_task(runner.run_turn(0, [_call("acme__pay", '{"message": "10 EUR"}')]))
    await asyncio.wait_for(pending.wait(), 5)
    assert [e.kind for e in events] == [EventKind.TOOL_CALL_START, EventKind.APPROVAL_PENDING]
    assert not task.done()
    fleet.approve(fleet.waiting_for_approval()[0])
    (envelope,) = await task
    assert envelope.output == {"value": "paid 10 EUR"}
    assert events[-1].kind is EventKind.TOOL_CALL_RESULT
    assert events[-1].envelope == envelope
    assert runner.last_tool == envelope


async def test_guard_rails_stop_calls_past_the_limits() -> None:
    fleet = _fleet()
    runner = await ToolRunner.open(fleet, run_id="r1", limits=AgentRunLimits(max_tool_calls=2))
    envelopes = await runner.run_turn(
        0, [_call("core__echo", json.dumps({"message": str(i)}), f"c{i}") for i in range(3)]
    )
    assert [e.status for e in envelopes] == ["success", "success", "error"]
    assert envelopes[2].error is not None
    assert envelopes[2].error.code.value == "resource_exhausted"
    assert len(fleet.submissions) == 2
    # No retry within this run can pass its limit: the model must not be told otherwise.
    assert not envelopes[2].error.retryable
    assert envelopes[2].error.details == {"limit": "max_tool_calls"}
    text, is_error = result_text(envelopes[2])
    assert is_error
    assert "(retryable)" not in text
    assert "max_tool_calls" in text
    assert "not retryable" in text

    budget = await ToolRunner.open(
        _fleet(), run_id="r2", limits=AgentRunLimits(max_result_bytes=10)
    )
    (first,) = await budget.run_turn(0, [_call("core__echo", '{"message": "0123456789"}')])
    (second,) = await budget.run_turn(1, [_call("core__echo", '{"message": "x"}')])
    assert first.ok
    assert first.result_bytes > 10
    assert second.error is not None
    assert "result budget" in second.error.message
    assert "max_result_bytes" in second.error.message
    assert not second.error.retryable


async def test_pinned_handles_pass_results_by_reference() -> None:
    fleet = _fleet()
    runner = await ToolRunner.open(fleet, run_id="r1")
    (found,) = await runner.run_turn(0, [_call("core__echo", '{"message": "Lyon"}')])
    runner.pin("city", found.call_id)
    (used,) = await runner.run_turn(
        1, [_call("core__echo", '{"message": {"$pinned": "city", "field": "value"}}')]
    )
    assert used.input == {"message": "Lyon"}
    assert used.output == {"value": "Lyon"}
    (missing,) = await runner.run_turn(2, [_call("core__echo", '{"message": {"$pinned": "nope"}}')])
    assert missing.error is not None
    assert "no pinned result" in missing.error.message


def _scripted(turns: list[dict[str, Any]]) -> Any:
    async def model(request: ModelRequest) -> dict[str, Any]:
        assert request.tools  # the catalog is shown every turn
        return turns[request.turn]

    return model


def _chat(*calls: tuple[str, str, str], text: str = "") -> dict[str, Any]:
    tool_calls = [
        {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
        for cid, name, args in calls
    ]
    message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls or None}
    return {"choices": [{"index": 0, "message": message}]}


SCRIPT = [
    _chat(("c1", "core__echo", '{"message": "hi"}'), ("c2", "core__echo", '{"message": ')),
    _chat(("c3", "core__echo", '{"message": "fixed"}')),
    _chat(text="done"),
]


async def test_run_agent_loops_records_and_replays(tmp_path: Path) -> None:
    fleet = _fleet()
    runner = await ToolRunner.open(fleet, run_id="loop-1")
    bundle = tmp_path / "run.jsonl"
    header = BundleHeader.of(runner, OpenAIChat())
    with BundleWriter(bundle, header) as recorder:
        run = await run_agent(
            _scripted(SCRIPT),
            runner=runner,
            adapter=OpenAIChat(),
            messages=[{"role": "user", "content": "say hi"}],
            recorder=recorder,
        )
    assert run.stopped == "done"
    assert run.text == "done"
    assert [run.tools_by_id[c].status for c in run.tool_order] == ["success", "error", "success"]
    assert run.last_tool is not None
    assert run.last_tool.output == {"value": "fixed"}
    roles = [m["role"] for m in run.messages]
    assert roles == ["user", "assistant", "tool", "tool", "assistant", "tool", "assistant"]

    recorded = read_bundle(bundle)
    assert len(recorded.turns) == 3
    report = await replay(recorded)
    assert report.reproduced, [str(d) for d in report.divergences]

    # A policy that no longer allows the tool, and a new version of it, both diverge.
    denied = await replay(recorded, allow_tools=["acme__*"])
    assert [(d.turn, d.index) for d in denied.divergences] == [(0, 0), (0, 1), (1, 0)]
    assert "permission_denied" in denied.divergences[0].reason
    bumped = [manifest("core__echo", EchoIn, version="2.0.0")]
    changed = await replay(recorded, manifests=bumped)
    assert "would run version 2.0.0" in str(changed.divergences[0])


async def test_a_crashed_loop_run_again_runs_no_tool_twice() -> None:
    fleet = _fleet()
    crash = {"armed": True}

    async def model(request: ModelRequest) -> dict[str, Any]:
        if request.turn == 2 and crash.pop("armed", False):
            raise RuntimeError("the agent process died")
        return SCRIPT[request.turn]

    runner = await ToolRunner.open(fleet, run_id="crashy")
    with pytest.raises(RuntimeError):
        await run_agent(model, runner=runner, adapter=OpenAIChat(), messages=[])
    ran = dict(fleet.runs)
    again = await ToolRunner.open(fleet, run_id="crashy")
    run = await run_agent(model, runner=again, adapter=OpenAIChat(), messages=[])
    assert run.stopped == "done"
    assert dict(fleet.runs) == ran == {"core__echo": 2}
    # The user can tell which calls were answered from the crashed run, not run again.
    first_run = {e.call_id for e in runner.tools_by_id.values() if e.invocation_id}
    marked = {e.call_id: e.deduplicated for e in again.tools_by_id.values()}
    assert marked
    assert all(marked[cid] for cid in first_run)
    assert not any(e.deduplicated for e in runner.tools_by_id.values())
    assert not any(e.cached for e in again.tools_by_id.values())


async def test_max_iterations_stops_the_loop() -> None:
    fleet = _fleet()
    runner = await ToolRunner.open(fleet, run_id="r", limits=AgentRunLimits(max_iterations=2))

    async def chatty(request: ModelRequest) -> ModelTurn:
        return ModelTurn(calls=[_call("core__echo", '{"message": "again"}')])

    run = await run_agent(chatty, runner=runner, adapter=OpenAIChat(), messages=[])
    assert run.stopped == "max_iterations"
    assert len(run.tool_order) == 2


async def test_a_streamed_response_drives_the_loop() -> None:
    fleet = _fleet()
    runner = await ToolRunner.open(fleet, run_id="stream")

    async def chunks(*deltas: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        for delta in deltas:
            yield {"choices": [{"index": 0, "delta": delta}]}

    def part(index: int, **function: str) -> dict[str, Any]:
        return {
            "tool_calls": [
                {
                    "index": index,
                    "id": f"s{index}" if "name" in function else None,
                    "function": function,
                }
            ]
        }

    async def model(request: ModelRequest) -> AsyncIterator[dict[str, Any]]:
        if request.turn == 0:
            return chunks(
                part(0, name="core__echo", arguments='{"mess'),
                part(1, name="core__echo", arguments='{"message": "two"}'),
                part(0, arguments='age": "one"}'),
            )
        return chunks({"content": "bye"})

    run = await run_agent(model, runner=runner, adapter=OpenAIChat(), messages=[])
    assert [run.tools_by_id[c].output for c in run.tool_order] == [
        {"value": "one"},
        {"value": "two"},
    ]
    assert run.text == "bye"


async def test_a_call_without_an_outcome_in_time_is_a_timeout_result() -> None:
    fleet = MemoryFleet()
    never = asyncio.Event()

    async def stuck(params: dict[str, Any]) -> dict[str, Any]:
        await never.wait()
        return {"value": "late"}

    fleet.add_tool(manifest("core__echo", EchoIn), stuck)
    runner = await ToolRunner.open(fleet, run_id="slow", limits=AgentRunLimits(call_timeout_s=0.05))
    (envelope,) = await runner.run_turn(0, [_call("core__echo", '{"message": "x"}')])
    assert envelope.status == "timeout"
    assert envelope.invocation_id is not None
    assert envelope.error is not None
    assert envelope.error.retryable
    (message,) = OpenAIChat().result_messages([envelope])
    assert message["content"].startswith("ERROR: error (timeout)")
    never.set()
