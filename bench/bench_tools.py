"""Tools of the end-to-end benchmark (``TOOLFLEET_TOOL_MODULES=bench_tools``)."""

from __future__ import annotations

from toolfleet.sdk import Sandbox, ToolContext, tool
from toolfleet.sdk.builtin import EchoInput, EchoOutput


@tool(
    id="bench__echo_process",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["message", "length"],
    timeout_seconds=5,
    sandbox=Sandbox(isolation="process"),
)
async def echo_process(params: EchoInput, ctx: ToolContext) -> EchoOutput:
    """``core__echo`` in a worker process of its own (forked by the executor's server)."""
    return EchoOutput(message=params.message, length=len(params.message))
