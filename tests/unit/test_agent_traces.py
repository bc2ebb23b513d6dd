"""One trace for an agent run: ``invoke_agent``, a span per model turn, and the calls
submitted inside their turn's span (so the fleet's spans join the same trace)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.unit.test_agent_runner import SCRIPT, _fleet, _scripted
from toolfleet.agent import MemoryFleet, OpenAIChat, ToolRunner, run_agent
from toolfleet.agent.port import Submission, Submitted
from toolfleet.events.identity import parse_traceparent
from toolfleet.observability import tracing

pytestmark = pytest.mark.unit


@dataclass
class TracedFleet:
    """The twin, noting the trace context each call was submitted in (as ClientFleet
    sends it: the current span's ``traceparent``)."""

    inner: MemoryFleet
    submitted_in: list[str] = field(default_factory=list)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    async def submit(self, submission: Submission) -> Submitted:
        self.submitted_in.append(tracing.current_traceparent())
        return await self.inner.submit(submission)


async def test_a_run_is_one_trace_of_turns_and_the_calls_in_them(
    exported: InMemorySpanExporter,
) -> None:
    fleet = TracedFleet(_fleet())
    runner = await ToolRunner.open(fleet, run_id="traced-1")  # type: ignore[arg-type]
    run = await run_agent(_scripted(SCRIPT), runner=runner, adapter=OpenAIChat(), messages=[])
    assert run.stopped == "done"

    spans = {s.name: s for s in exported.get_finished_spans()}
    agent = spans["invoke_agent"]
    assert dict(agent.attributes or {}) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.conversation.id": "traced-1",
        "toolfleet.agent.provider": "openai-chat",
        "toolfleet.agent.stopped": "done",
    }
    turns = [spans[f"turn {n}"] for n in range(3)]
    assert agent.context is not None
    trace_id = agent.context.trace_id
    for turn in turns:
        assert turn.parent is not None
        assert turn.parent.span_id == agent.context.span_id
        assert turn.context is not None
        assert turn.context.trace_id == trace_id
    assert [dict(t.attributes or {})["toolfleet.agent.tool_calls"] for t in turns] == [2, 1, 0]

    # Every call the fleet ran was submitted in its turn's span: its spans join this trace.
    parents = {f"{t.context.span_id:016x}" for t in turns if t.context is not None}
    assert len(fleet.submitted_in) == 2  # the malformed call never reaches the fleet
    for traceparent in fleet.submitted_in:
        parsed = parse_traceparent(traceparent)
        assert parsed is not None
        assert parsed.trace_id == f"{trace_id:032x}"
        assert parsed.parent_id in parents
