"""LangChain tools that run through the agent runner (needs the ``agent`` extra).

Each catalog tool becomes a ``BaseTool`` whose JSON Schema is the run's provider-safe
schema. Calling it goes through :meth:`ToolRunner.call`, so the same catalog check,
argument validation, guard rails, deterministic ids and events apply as for a model
turn: nothing bypasses the runner. Errors come back as the tool's text (LangChain's
``handle_tool_error``), so the model can correct the call.
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForToolRun, CallbackManagerForToolRun
from langchain_core.tools import BaseTool, ToolException
from pydantic import PrivateAttr

from toolfleet.agent.adapters import result_text
from toolfleet.agent.runner import ToolRunner

__all__ = ["FleetTool", "langchain_tools"]


class FleetTool(BaseTool):
    """One fleet tool as LangChain sees it. Async only (``ainvoke``)."""

    handle_tool_error: bool = True
    _runner: ToolRunner = PrivateAttr()

    def __init__(self, *, runner: ToolRunner, **fields: Any) -> None:
        super().__init__(**fields)
        self._runner = runner

    def _run(
        self, *args: Any, run_manager: CallbackManagerForToolRun | None = None, **kwargs: Any
    ) -> str:
        raise NotImplementedError("fleet tools run asynchronously: use ainvoke")

    async def _arun(
        self,
        *args: Any,
        run_manager: AsyncCallbackManagerForToolRun | None = None,
        **kwargs: Any,
    ) -> str:
        envelope = await self._runner.call(self.name, kwargs)
        text, is_error = result_text(envelope)
        if is_error:
            raise ToolException(text)
        return text


def langchain_tools(runner: ToolRunner) -> list[FleetTool]:
    """The run's catalog as LangChain tools."""
    return [
        FleetTool(
            name=tool.name, description=tool.description, args_schema=tool.schema, runner=runner
        )
        for tool in runner.catalog.tools
    ]
