"""``run_agent``: the model-agnostic loop driver.

Each iteration asks ``model_fn`` for a response (a provider-shaped dict, a stream of
provider events, or a ready :class:`~toolfleet.agent.records.ModelTurn`), decodes it
with the adapter, runs its tool calls through the runner, appends the model's message
and the results to the conversation, and stops when the model asks for no tool or
``max_iterations`` is reached. With a ``recorder`` (a replay bundle's
:class:`~toolfleet.agent.replay.BundleWriter`) every turn is written as it ends.

When OpenTelemetry records (the application installed a tracer provider), the run is an
``invoke_agent`` span (the GenAI conventions' agent operation) with one ``turn {n}``
span per model turn under it; the calls of a turn are submitted inside its span, so the
fleet's spans of each call (``execute_tool {tool}`` among them) join the same trace.
Without a provider the spans cost nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolfleet.agent.adapters import ProviderAdapter
from toolfleet.agent.records import ModelTurn, ToolEnvelope
from toolfleet.agent.runner import ToolRunner
from toolfleet.agent.traces import run_span

__all__ = ["AgentRun", "ModelFn", "ModelRequest", "ModelResponse", "TurnRecorder", "run_agent"]

ModelResponse = Mapping[str, Any] | AsyncIterable[Mapping[str, Any]] | ModelTurn


@dataclass(frozen=True, kw_only=True)
class ModelRequest:
    """What the model is asked on one turn."""

    turn: int
    messages: list[dict[str, Any]]
    """The conversation so far, in the adapter's provider shape."""
    tools: list[dict[str, Any]]
    """The run's catalog as the provider's tool definitions."""


ModelFn = Callable[[ModelRequest], Awaitable[ModelResponse]]


class TurnRecorder(Protocol):
    """Where each finished turn goes (a replay bundle's writer)."""

    def turn(self, turn: int, model: ModelTurn, envelopes: Iterable[ToolEnvelope]) -> None: ...


@dataclass(kw_only=True)
class AgentRun:
    """What a finished loop leaves."""

    messages: list[dict[str, Any]]
    turns: list[ModelTurn] = field(default_factory=list)
    stopped: str = "done"
    """``done`` (the model asked for no tool) or ``max_iterations``."""
    tools_by_id: dict[str, ToolEnvelope] = field(default_factory=dict)
    tool_order: list[str] = field(default_factory=list)

    @property
    def last_tool(self) -> ToolEnvelope | None:
        return self.tools_by_id[self.tool_order[-1]] if self.tool_order else None

    @property
    def text(self) -> str:
        """The model's last words."""
        return self.turns[-1].text if self.turns else ""


async def decode_response(adapter: ProviderAdapter, response: ModelResponse) -> ModelTurn:
    """A whole response, a stream or a ready turn, as a turn."""
    if isinstance(response, ModelTurn):
        return response
    if isinstance(response, Mapping):
        return adapter.decode(response)
    decoder = adapter.stream()
    async for event in response:
        decoder.feed(event)
    return decoder.finish()


async def run_agent(
    model_fn: ModelFn,
    *,
    runner: ToolRunner,
    adapter: ProviderAdapter,
    messages: list[dict[str, Any]],
    recorder: TurnRecorder | None = None,
) -> AgentRun:
    """Drive the loop until the model stops asking for tools (or the iteration cap)."""
    history = list(messages)
    tools = adapter.encode_tools(runner.catalog)
    run = AgentRun(messages=history)
    agent: dict[str, str | int] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.conversation.id": runner.run_id,
        "toolfleet.agent.provider": adapter.name,
    }
    with run_span("invoke_agent", attributes=agent) as agent_span:
        for turn in range(runner.limits.max_iterations):
            with run_span(f"turn {turn}", attributes={"toolfleet.agent.turn": turn}) as turn_span:
                response = await model_fn(
                    ModelRequest(turn=turn, messages=list(history), tools=tools)
                )
                decoded = await decode_response(adapter, response)
                run.turns.append(decoded)
                history.extend(decoded.assistant_messages)
                turn_span.set_attribute("toolfleet.agent.tool_calls", len(decoded.calls))
                if not decoded.calls:
                    if recorder is not None:
                        recorder.turn(turn, decoded, [])
                    break
                envelopes = await runner.run_turn(turn, decoded.calls)
                if recorder is not None:
                    recorder.turn(turn, decoded, envelopes)
                history.extend(adapter.result_messages(envelopes))
        else:
            run.stopped = "max_iterations"
        agent_span.set_attribute("toolfleet.agent.stopped", run.stopped)
    run.tools_by_id = dict(runner.tools_by_id)
    run.tool_order = list(runner.tool_order)
    return run
