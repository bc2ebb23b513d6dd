"""Tools of the end-to-end benchmark (``TOOLFLEET_TOOL_MODULES=bench_tools``)."""

from __future__ import annotations

from pydantic import BaseModel

from toolfleet.sdk import ToolContext, tool


class EchoInput(BaseModel):
    message: str


class EchoOutput(BaseModel):
    message: str
    length: int


@tool(
    id="bench__echo_process",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["message", "length"],
    timeout_seconds=5,
    isolation="process",
)
async def echo_process(params: EchoInput, ctx: ToolContext) -> EchoOutput:
    """``core__echo`` in a worker process of the executor's warm pool."""
    return EchoOutput(message=params.message, length=len(params.message))


TOOLS = [echo_process]
