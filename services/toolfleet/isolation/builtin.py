"""``core__run_python``: a code interpreter, always in a sandbox, with no network.

The code runs as ``python -I -c CODE`` in the sandbox's work dir, in a session of its
own, with the sandbox's limits. stdout and stderr are kept up to 1 MiB each (the rest
is dropped and the stream ends with a marker); past ``timeout_s`` the code is killed
and the call ends with ``timeout``. Effect ``external_side_effect``: policies decide
who may run code.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

from pydantic import BaseModel, Field

from toolfleet.errors import SandboxFailure, ToolTimeout
from toolfleet.events.models import Effect
from toolfleet.tools.context import ToolContext
from toolfleet.tools.limits import Isolation
from toolfleet.tools.options import Sandbox
from toolfleet.tools.spec import tool

#: Set in every sandboxed worker's environment; ``core__run_python`` refuses without it.
SANDBOX_MARKER = "TOOLFLEET_SANDBOX"
#: Bytes of stdout and of stderr kept.
MAX_STREAM_BYTES = 1024 * 1024
_CUT = "\n[output truncated]"


class RunPythonInput(BaseModel):
    code: str = Field(max_length=200_000, description="Python 3 source to run")
    timeout_s: float = Field(default=10.0, gt=0, le=60, description="wall clock, seconds")


class RunPythonOutput(BaseModel):
    stdout: str
    stderr: str
    exit_code: int


@tool(
    id="core__run_python",
    version="1.0.0",
    effect=Effect.EXTERNAL_SIDE_EFFECT,
    redaction_allowlist=["stdout", "stderr", "exit_code"],
    timeout_seconds=65,
    category="core",
    tags=["code", "sandbox"],
    sandbox=Sandbox(isolation=Isolation.SANDBOX),
)
async def run_python(params: RunPythonInput, ctx: ToolContext) -> RunPythonOutput:
    """Runs Python code in a sandbox (no network, only its work dir); returns its output."""
    if os.environ.get(SANDBOX_MARKER) != "1":
        raise SandboxFailure("core__run_python runs only inside a sandbox")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-I",
        "-c",
        params.code,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    reads = asyncio.gather(_capped(process.stdout), _capped(process.stderr))
    try:
        async with asyncio.timeout(params.timeout_s):
            stdout, stderr = await reads
            exit_code = await process.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 9)
        await process.wait()
        reads.cancel()
        raise ToolTimeout(f"the code did not finish within {params.timeout_s:g}s") from None
    return RunPythonOutput(stdout=stdout, stderr=stderr, exit_code=exit_code)


async def _capped(stream: asyncio.StreamReader) -> str:
    kept = bytearray()
    cut = False
    while chunk := await stream.read(65536):
        room = MAX_STREAM_BYTES - len(kept)
        if len(chunk) > room:
            cut = True
        kept += chunk[: max(room, 0)]
    text = kept.decode(errors="replace")
    return text + _CUT if cut else text
