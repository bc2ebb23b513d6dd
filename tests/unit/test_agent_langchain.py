"""LangChain tools built from a run's catalog go through the runner, never around it."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import ToolMessage

from tests.support.agent_fixtures import EchoIn, manifest
from toolfleet.agent import MemoryFleet, ToolRunner
from toolfleet.agent.langchain import langchain_tools

pytestmark = pytest.mark.unit


async def _runner() -> tuple[MemoryFleet, ToolRunner]:
    fleet = MemoryFleet()

    async def echo(params: dict[str, Any]) -> dict[str, Any]:
        return {"value": params["message"]}

    fleet.add_tool(manifest("core__echo", EchoIn, description="Says it back."), echo)
    return fleet, await ToolRunner.open(fleet, run_id="lc")


async def test_a_langchain_tool_runs_through_the_runner() -> None:
    fleet, runner = await _runner()
    (tool,) = langchain_tools(runner)
    assert (tool.name, tool.description) == ("core__echo", "Says it back.")
    assert tool.args == {"message": {"title": "Message", "type": "string"}}

    assert await tool.ainvoke({"message": "hi"}) == '{"value":"hi"}'
    message = await tool.ainvoke(
        {"type": "tool_call", "id": "call_9", "name": "core__echo", "args": {"message": "yo"}}
    )
    assert isinstance(message, ToolMessage)
    assert message.tool_call_id == "call_9"
    assert message.content == '{"value":"yo"}'
    assert [s.parameters for s in fleet.submissions] == [{"message": "hi"}, {"message": "yo"}]
    assert [runner.tools_by_id[c].turn for c in runner.tool_order] == [0, 1]


async def test_invalid_arguments_come_back_as_text_the_model_can_read() -> None:
    fleet, runner = await _runner()
    (tool,) = langchain_tools(runner)
    answer = await tool.ainvoke({"msg": "hi"})
    assert answer.startswith("error (invalid_parameters)")
    assert "message" in answer
    assert fleet.submissions == []
