"""Command tools: any executable, in any language, run in a sandbox.

The manifest names the command (``command=["/usr/bin/jq", "-c", "..."]``). The tool
gets its JSON parameters on stdin and prints one JSON object, its result, on stdout.
Checkpoints are JSON lines written to the fd named by ``TOOLFLEET_CHECKPOINT_FD``, each
``{"state": {...}, "progress_percent": 50, "current_phase": "..."}``; the state of the
latest one comes back on a resume in ``TOOLFLEET_RESUME_STATE`` (JSON). Exit status 0
is success; any other status is ``tool_execution_error``. A cancel sends SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from dataclasses import replace
from typing import Any

from pydantic import BaseModel, ConfigDict

from toolfleet.errors import (
    RegistrationError,
    ResourceExhausted,
    SandboxFailure,
    ToolExecutionError,
)
from toolfleet.events.models import Effect
from toolfleet.isolation.protocol import RunJob
from toolfleet.tools.context import ToolContext
from toolfleet.tools.limits import Isolation
from toolfleet.tools.options import Sandbox
from toolfleet.tools.spec import SPEC_ATTRIBUTE, ToolFunction, spec_of, tool


async def run_command(job: RunJob, ctx: ToolContext) -> dict[str, Any]:
    """Run ``job.command`` with the parameters on stdin; its stdout is the result."""
    tool_id, limit = job.tool_id, job.limits.max_output_bytes
    read_fd, write_fd = os.pipe()
    env = dict(os.environ, TOOLFLEET_CHECKPOINT_FD=str(write_fd))
    if ctx.resume_state() is not None:
        env["TOOLFLEET_RESUME_STATE"] = json.dumps(ctx.resume_state())
    try:
        process = await asyncio.create_subprocess_exec(
            *job.command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
            pass_fds=(write_fd,),  # the worker's RPC socket is close-on-exec: not passed
        )
    except OSError as exc:
        raise ToolExecutionError(
            f"{tool_id}: the command could not start ({exc.strerror})"
        ) from None
    finally:
        os.close(write_fd)
    assert process.stdin is not None
    assert process.stdout is not None
    side = asyncio.create_task(_checkpoints(read_fd, ctx))
    watcher = asyncio.create_task(_cancel_on(ctx, process))
    try:
        process.stdin.write(json.dumps(job.parameters).encode())
        with contextlib.suppress(OSError):
            await process.stdin.drain()
        process.stdin.close()
        output = bytearray()
        while chunk := await process.stdout.read(65536):
            output += chunk
            if len(output) > limit:
                process.kill()
                raise ResourceExhausted(f"{tool_id} printed more than {limit} bytes")
        status = await process.wait()
    finally:
        watcher.cancel()
        await side
    if status != 0:
        raise ToolExecutionError(f"{tool_id} exited with status {status}")
    try:
        result = json.loads(output)
    except ValueError:
        raise ToolExecutionError(f"{tool_id} did not print a JSON object") from None
    if not isinstance(result, dict):
        raise ToolExecutionError(f"{tool_id} did not print a JSON object")
    return result


async def _cancel_on(ctx: ToolContext, process: asyncio.subprocess.Process) -> None:
    while not ctx.cancelled:  # noqa: ASYNC110 (the context exposes a flag, not its event)
        await asyncio.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)


async def _checkpoints(fd: int, ctx: ToolContext) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1024 * 1024)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0)
    )
    try:
        while line := await reader.readline():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # not a checkpoint line: ignored
            if not isinstance(entry, dict):
                continue
            state = entry.get("state", {})
            await ctx.checkpoint(
                state if isinstance(state, dict) else {"value": state},
                progress_percent=float(entry.get("progress_percent", 0.0)),
                current_phase=str(entry.get("current_phase", "")),
            )
    finally:
        transport.close()


class CommandParameters(BaseModel):
    """Default input model of a command tool: any JSON object."""

    model_config = ConfigDict(extra="allow")


class CommandResult(BaseModel):
    """Default output model of a command tool: any JSON object."""

    model_config = ConfigDict(extra="allow")


def command_tool(
    *,
    id: str,
    version: str,
    command: list[str] | tuple[str, ...],
    effect: Effect | str,
    redaction_allowlist: list[str] | tuple[str, ...],
    input_model: type[BaseModel] = CommandParameters,
    output_model: type[BaseModel] = CommandResult,
    **options: Any,
) -> ToolFunction:
    """Declare a command tool: ``command`` runs in a sandbox for every call.

    Example::

        wc = command_tool(id="acme__wc", version="1.0.0", effect="read_only",
                          command=["/usr/bin/python3", "-c", SOURCE],
                          input_model=WcIn, output_model=WcOut,
                          redaction_allowlist=["lines"])

    List it in a tool module's ``TOOLS`` like any other tool. Other options are
    :func:`~toolfleet.tools.spec.tool`'s; ``sandbox.isolation`` is always ``sandbox``.
    """
    if not command or not os.path.isabs(command[0]):
        raise RegistrationError(f"{id}: command names an executable by its absolute path")

    async def run(params: Any, ctx: ToolContext) -> Any:
        raise SandboxFailure(f"{id} is a command tool: it runs only in a sandbox")

    run.__annotations__ = {"params": input_model, "ctx": ToolContext, "return": output_model}
    run.__qualname__ = run.__name__ = id
    sandbox = replace(options.pop("sandbox", None) or Sandbox(), isolation=Isolation.SANDBOX)
    declared = tool(
        id=id,
        version=version,
        effect=effect,
        redaction_allowlist=redaction_allowlist,
        sandbox=sandbox,
        **options,
    )(run)
    setattr(declared, SPEC_ATTRIBUTE, replace(spec_of(declared), command=tuple(command)))
    return declared
