"""Tools that misbehave on purpose, for the isolation tests (sandboxed unless stated)."""

# They block and open files inside async functions on purpose: that is the hostility.
# ruff: noqa: ASYNC230, ASYNC251

from __future__ import annotations

import asyncio
import ctypes
import os
import socket
import sys
import time

from pydantic import BaseModel, Field

from toolfleet.sdk import (
    ResourceDefaults,
    Sandbox,
    ToolContext,
    ToolLimits,
    ToolPermissions,
    command_tool,
    tool,
)

#: Whether this module was imported by a call's job (its environment set) or before it,
#: by a warm worker kept for one of its tools.
IMPORTED_IN_A_CALL = "TOOLFLEET_SANDBOX" in os.environ
#: The process that imported this module (a ``process`` worker's fork server, once it
#: imported the module for the tool's warm workers).
IMPORTED_BY = os.getpid()


class Empty(BaseModel):
    pass


class Text(BaseModel):
    text: str = ""


class Path(BaseModel):
    path: str


class Target(BaseModel):
    host: str
    port: int
    use_proxy: bool = False


class Steps(BaseModel):
    steps: int = Field(default=3, ge=1)
    step_seconds: float = 0.0


class StepsOut(BaseModel):
    steps_completed: int
    resumed_from_step: int | None
    secret_length: int = 0


def _hostile(
    name: str, timeout: float = 5.0, sandbox: Sandbox | None = None, **kw: object
) -> object:
    return tool(
        id=f"hostile__{name}",
        version="1.0.0",
        effect="read_only",
        redaction_allowlist=["text"],
        timeout_seconds=timeout,
        sandbox=sandbox or Sandbox(isolation="sandbox"),
        **kw,  # type: ignore[arg-type]
    )


@_hostile("echo")
async def echo(params: Text, ctx: ToolContext) -> Text:
    return Text(text=params.text)


@_hostile("busy_loop", timeout=2.0)
async def busy_loop(params: Empty, ctx: ToolContext) -> Text:
    while True:
        pass


@_hostile("blocking_sleep", timeout=1.0)
async def blocking_sleep(params: Empty, ctx: ToolContext) -> Text:
    time.sleep(60)
    return Text(text="woke")


@_hostile("memory_hog", timeout=20.0)
async def memory_hog(params: Empty, ctx: ToolContext) -> Text:
    hog = []
    while True:
        hog.append(bytearray(16 * 1024 * 1024))


@_hostile("fork_bomb", timeout=10.0)
async def fork_bomb(params: Empty, ctx: ToolContext) -> Text:
    children = 0
    refused = ""
    for _ in range(10_000):
        try:
            pid = os.fork()
        except OSError as exc:
            refused = type(exc).__name__
            break
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
    return Text(text=f"{children} {refused}")


@_hostile("write_file")
async def write_file(params: Path, ctx: ToolContext) -> Text:
    with open(params.path, "w") as handle:
        handle.write("pwned")
    return Text(text="written")


@_hostile("read_file")
async def read_file(params: Path, ctx: ToolContext) -> Text:
    with open(params.path) as handle:
        return Text(text=handle.read())


@_hostile("environment")
async def environment(params: Empty, ctx: ToolContext) -> Text:
    return Text(text="\\n".join(f"{k}={v}" for k, v in os.environ.items()))


@_hostile("connect")
async def connect(params: Target, ctx: ToolContext) -> Text:
    if params.use_proxy:
        import urllib.request

        url = f"http://{params.host}:{params.port}/"
        proxy = urllib.request.ProxyHandler({"http": os.environ.get("HTTP_PROXY", "")})
        try:
            with urllib.request.build_opener(proxy).open(url, timeout=5) as response:
                return Text(text=f"{response.status} {response.read().decode()}")
        except urllib.error.HTTPError as exc:
            return Text(text=f"{exc.code} refused")
    with socket.create_connection((params.host, params.port), timeout=3):
        return Text(text="connected")


@_hostile("segfault")
async def segfault(params: Empty, ctx: ToolContext) -> Text:
    ctypes.string_at(0)
    return Text(text="survived")


@_hostile("flood_stdout", timeout=30.0)
async def flood_stdout(params: Empty, ctx: ToolContext) -> Text:
    chunk = "x" * (1024 * 1024)
    for _ in range(1024):  # 1 GiB
        sys.stdout.write(chunk)
    return Text(text="flooded")


@_hostile("ptrace")
async def ptrace(params: Empty, ctx: ToolContext) -> Text:
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.syscall(101, 0, 1, 0, 0)  # PTRACE_TRACEME (x86_64)
    return Text(text=f"{result} {ctypes.get_errno()}")


@_hostile("whoami")
async def whoami(params: Empty, ctx: ToolContext) -> Text:
    return Text(text=f"{os.getuid()} {os.getpid()} {os.getcwd()}")


@tool(
    id="hostile__steps",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["steps_completed", "resumed_from_step", "secret_length"],
    timeout_seconds=30,
    sandbox=Sandbox(isolation="sandbox"),
)
async def steps(params: Steps, ctx: ToolContext) -> StepsOut:
    """Checkpoints each step, stops when cancelled (the isolated twin of long_running)."""
    state = ctx.resume_state()
    start = int(state["step"]) if state else 0
    for step in range(start, params.steps):
        if ctx.cancelled:
            from toolfleet.errors import Cancelled

            raise Cancelled(f"cancelled after {step} steps")
        await asyncio.sleep(params.step_seconds)
        await ctx.checkpoint({"step": step + 1}, 100.0 * (step + 1) / params.steps)
    return StepsOut(steps_completed=params.steps, resumed_from_step=start if state else None)


@tool(
    id="hostile__credential",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["steps_completed", "resumed_from_step", "secret_length"],
    timeout_seconds=5,
    sandbox=Sandbox(isolation="process", permissions=ToolPermissions(credentials=["api_key"])),
)
async def credential(params: Empty, ctx: ToolContext) -> StepsOut:
    """Reads a credential over the RPC; returns its length only."""
    return StepsOut(
        steps_completed=0,
        resumed_from_step=None,
        secret_length=len(ctx.credential("api_key").reveal()),
    )


class WordsIn(BaseModel):
    text: str


class WordsOut(BaseModel):
    words: int


_WORDS = """
import json, os, sys
params = json.load(sys.stdin)
with os.fdopen(int(os.environ["TOOLFLEET_CHECKPOINT_FD"]), "w") as side:
    side.write(json.dumps({"state": {"seen": len(params["text"])}, "progress_percent": 50}) + "\\n")
if params["text"] == "fail":
    sys.exit(3)
print(json.dumps({"words": len(params["text"].split())}))
"""

words = command_tool(
    id="hostile__words",
    version="1.0.0",
    command=[sys.executable, "-I", "-c", _WORDS],
    effect="read_only",
    redaction_allowlist=["words"],
    input_model=WordsIn,
    output_model=WordsOut,
)


@tool(
    id="hostile__needy",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["text"],
    timeout_seconds=5,
    sandbox=Sandbox(limits=ToolLimits(memory_mb=256)),
)
async def needy(params: Empty, ctx: ToolContext) -> Text:
    """Declares 256 MB: an agent with less is refused before it runs (BC-1)."""
    return Text(text="ran")


@_hostile(
    "rlimits",
    sandbox=Sandbox(isolation="sandbox", defaults=ResourceDefaults(memory_mb_limit=200)),
)
async def rlimits(params: Empty, ctx: ToolContext) -> Text:
    """Reports the address-space limit it runs under, in MB (the tests give its manifest
    a ``resource_defaults`` of 200)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return Text(text=str(soft // (1024 * 1024)))


class DocumentId(BaseModel):
    document_id: str
    forbidden: str


@_hostile("documents")
async def documents(params: DocumentId, ctx: ToolContext) -> Text:
    """Reads a document, its metadata and a search through ``ctx.documents`` (over the
    RPC when isolated), then one document its request does not name."""
    from toolfleet.errors import ToolfleetError

    doc = await ctx.documents.get(params.document_id)
    meta = await ctx.documents.metadata(params.document_id)
    hits = await ctx.documents.search(doc.content.split()[0], limit=5)
    try:
        await ctx.documents.get(params.forbidden)
        denied = "read"
    except ToolfleetError as exc:
        denied = str(exc.code)
    found = ",".join(hit.document_id for hit in hits)
    return Text(text=f"{doc.version} {meta.latest_version} {found} {denied} {doc.content}")


@_hostile("imported_by")
async def imported_by(params: Empty, ctx: ToolContext) -> Text:
    """``"{pid that imported the module} {own pid}"``."""
    return Text(text=f"{IMPORTED_BY} {os.getpid()}")


@_hostile("preloaded")
async def preloaded(params: Empty, ctx: ToolContext) -> Text:
    """Says whether its module was imported before the call (a warm worker kept for it)."""
    return Text(text="imported in the call" if IMPORTED_IN_A_CALL else "imported before")
