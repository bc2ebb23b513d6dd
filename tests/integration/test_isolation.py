"""The isolation runtime on this host: real bubblewrap sandboxes, real kernel limits.

Every hostile tool ends with its typed outcome, and the runtime goes on serving: each
test runs a plain echo afterwards through the same runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import hostile_tools, sandbox_probes
from tests.support.eventually import eventually
from toolfleet.documents.cache import DocumentCache, MemoryCacheStore
from toolfleet.documents.pins import MemoryDocumentPins, MemoryPinBook
from toolfleet.documents.reader import CallDocuments
from toolfleet.documents.source import MemoryDocumentSource
from toolfleet.errors import ErrorCode, PermissionDenied, SandboxFailure
from toolfleet.events.identity import CallKey
from toolfleet.events.models import DocumentContext
from toolfleet.executor.isolated import IsolatedRunner
from toolfleet.isolation.builtin import RunPythonInput, run_python
from toolfleet.isolation.egress import EgressDecision, EgressGrant, EgressProxy, MemoryEgressAudit
from toolfleet.isolation.runtime import (
    Grants,
    IsolatedCall,
    IsolatedResult,
    IsolationRuntime,
    RuntimeConfig,
)
from toolfleet.isolation.sandbox import parse_filesystem_permissions
from toolfleet.secrets.store import Secret
from toolfleet.tools.context import CheckpointInput, ToolContext
from toolfleet.tools.limits import AgentLimits, FleetLimits, Isolation, RunLimits
from toolfleet.tools.spec import spec_of

pytestmark = pytest.mark.integration

AUDIT = MemoryEgressAudit()


def limits(**overrides: Any) -> RunLimits:
    values: dict[str, Any] = {
        "timeout_s": 5.0,
        "kill_grace_s": 0.5,
        "cpu_seconds": 5,
        "memory_mb": 512,
        "max_processes": 32,
        "max_file_mb": 16,
        "max_open_files": 128,
        "max_output_bytes": 1024 * 1024,
    }
    values.update(overrides)
    return RunLimits(**values)


class Sink:
    def __init__(self) -> None:
        self.saved: list[CheckpointInput] = []

    async def save(self, checkpoint: CheckpointInput) -> str:
        self.saved.append(checkpoint)
        return f"cp-{len(self.saved)}"


class Credentials:
    def get(self, name: str) -> Secret:
        if name != "api_key":
            raise PermissionDenied(f"{name} not declared")
        return Secret("s3cr3t-value")


@pytest.fixture(scope="module")
async def runtime() -> AsyncIterator[IsolationRuntime]:
    async with (
        EgressProxy(audit=AUDIT) as proxy,
        IsolationRuntime(
            config=RuntimeConfig(warm_sandboxes=1, warm_processes=1), egress=proxy
        ) as runtime,
    ):
        assert runtime.sandboxes, runtime.support.problem
        yield runtime


async def run(
    runtime: IsolationRuntime,
    fn: Any,
    parameters: dict[str, Any] | None = None,
    *,
    grants: Grants | None = None,
    ctx: ToolContext | None = None,
    isolation: Isolation | None = None,
    **limit_overrides: Any,
) -> IsolatedResult:
    spec = spec_of(fn)
    ctx = ctx or ToolContext(
        tenant_id="tenant_a",
        agent_did="did:agent:a",
        invocation_id="inv-1",
        tool_id=spec.tool_id,
        tool_version=spec.version,
    )
    call = call_of(fn, parameters, grants=grants, isolation=isolation, **limit_overrides)
    return await runtime.run(call, ctx)


def call_of(
    fn: Any,
    parameters: dict[str, Any] | None = None,
    *,
    grants: Grants | None = None,
    isolation: Isolation | None = None,
    **limit_overrides: Any,
) -> IsolatedCall:
    """The isolated call of tool ``fn`` (its own isolation unless ``isolation``)."""
    spec = spec_of(fn)
    return IsolatedCall(
        isolation=isolation or spec.isolation,
        tool_id=spec.tool_id,
        target=spec.target,
        command=spec.command,
        parameters=parameters or {},
        limits=limits(**limit_overrides),
        grants=grants or Grants(),
        credentials=bool(spec.credentials),
    )


async def still_serving(runtime: IsolationRuntime) -> None:
    outcome = await run(runtime, hostile_tools.echo, {"text": "still here"})
    assert outcome.result == {"text": "still here"}


def code(outcome: IsolatedResult) -> str | None:
    return None if outcome.error is None else str(outcome.error.code)


async def test_echo_runs_sandboxed_as_its_own_uid_in_its_own_pid_namespace(
    runtime: IsolationRuntime,
) -> None:
    outcome = await run(runtime, hostile_tools.whoami)
    assert outcome.result is not None
    uid, pid, cwd = outcome.result["text"].split()
    assert int(uid) != 0
    assert int(pid) < 10
    assert cwd == "/home/tool"
    assert outcome.usage.cpu_millicore_seconds > 0
    assert outcome.usage.memory_peak_mb > 5


async def test_busy_loop_past_its_timeout_is_a_timeout(runtime: IsolationRuntime) -> None:
    outcome = await run(runtime, hostile_tools.busy_loop, timeout_s=1.5, cpu_seconds=30)
    assert code(outcome) == ErrorCode.TIMEOUT
    assert outcome.usage.cpu_millicore_seconds >= 100  # it did spin
    await still_serving(runtime)


async def test_cpu_time_limit_stops_a_busy_loop(runtime: IsolationRuntime) -> None:
    outcome = await run(runtime, hostile_tools.busy_loop, timeout_s=30, cpu_seconds=1)
    assert code(outcome) == ErrorCode.TIMEOUT
    assert outcome.error is not None
    assert "CPU" in outcome.error.message


async def test_blocking_sleep_in_sync_code_is_a_timeout(runtime: IsolationRuntime) -> None:
    other = asyncio.create_task(run(runtime, hostile_tools.echo, {"text": "meanwhile"}))
    outcome = await run(runtime, hostile_tools.blocking_sleep, timeout_s=1.0)
    assert code(outcome) == ErrorCode.TIMEOUT
    assert (await other).result == {"text": "meanwhile"}  # undisturbed


async def test_memory_hog_is_resource_exhausted(runtime: IsolationRuntime) -> None:
    outcome = await run(runtime, hostile_tools.memory_hog, memory_mb=256)
    assert code(outcome) == ErrorCode.RESOURCE_EXHAUSTED
    assert 100 <= outcome.usage.memory_peak_mb <= 300
    await still_serving(runtime)


async def test_fork_bomb_stops_at_the_process_limit(runtime: IsolationRuntime) -> None:
    outcome = await run(runtime, hostile_tools.fork_bomb, max_processes=16)
    assert outcome.result is not None
    children, refused = outcome.result["text"].split()
    assert int(children) < 16
    assert refused == "BlockingIOError"
    await still_serving(runtime)


async def test_writing_outside_the_work_dir_is_refused(
    runtime: IsolationRuntime, tmp_path: Path
) -> None:
    for path in ("/usr/pwned", "/etc/pwned", str(tmp_path / "pwned")):
        outcome = await run(runtime, hostile_tools.write_file, {"path": path})
        assert code(outcome) == ErrorCode.TOOL_EXECUTION_ERROR
    assert not (tmp_path / "pwned").exists()
    inside = await run(runtime, hostile_tools.write_file, {"path": "/home/tool/ok"})
    assert inside.result == {"text": "written"}


async def test_host_secrets_are_out_of_sight(runtime: IsolationRuntime) -> None:
    os.environ["TOOLFLEET_TEST_EXECUTOR_SECRET"] = "executor-only"
    try:
        env = await run(runtime, hostile_tools.environment)
    finally:
        del os.environ["TOOLFLEET_TEST_EXECUTOR_SECRET"]
    assert env.result is not None
    assert "executor-only" not in env.result["text"]
    for path in ("/proc/1/environ", f"/proc/{os.getpid()}/environ", "/root/.bashrc"):
        outcome = await run(runtime, hostile_tools.read_file, {"path": path})
        assert code(outcome) == ErrorCode.TOOL_EXECUTION_ERROR, path


async def test_only_granted_paths_are_bound(runtime: IsolationRuntime, tmp_path: Path) -> None:
    mine, theirs = tmp_path / "tenant_a", tmp_path / "tenant_b"
    for root in (mine, theirs):
        root.mkdir()
        (root / "data.txt").write_text(f"data of {root.name}")
        root.chmod(0o755)
        (root / "data.txt").chmod(0o644)
    tmp_path.chmod(0o755)  # noqa: ASYNC240 (test setup)
    grants = Grants(binds=parse_filesystem_permissions([str(mine)]))
    own = await run(
        runtime, hostile_tools.read_file, {"path": str(mine / "data.txt")}, grants=grants
    )
    assert own.result == {"text": "data of tenant_a"}
    other = await run(
        runtime, hostile_tools.read_file, {"path": str(theirs / "data.txt")}, grants=grants
    )
    assert code(other) == ErrorCode.TOOL_EXECUTION_ERROR
    read_only = await run(
        runtime, hostile_tools.write_file, {"path": str(mine / "data.txt")}, grants=grants
    )
    assert code(read_only) == ErrorCode.TOOL_EXECUTION_ERROR
    writable = Grants(binds=parse_filesystem_permissions([f"rw:{mine}"]))
    mine.chmod(0o777)
    (mine / "data.txt").chmod(0o666)
    wrote = await run(
        runtime, hostile_tools.write_file, {"path": str(mine / "data.txt")}, grants=writable
    )
    assert wrote.result == {"text": "written"}
    assert (mine / "data.txt").read_text() == "pwned"


async def test_no_network_without_a_grant(runtime: IsolationRuntime) -> None:
    outcome = await run(runtime, hostile_tools.connect, {"host": "127.0.0.1", "port": 5432})
    assert code(outcome) == ErrorCode.TOOL_EXECUTION_ERROR


async def test_granted_host_is_reached_through_the_proxy_and_others_refused(
    runtime: IsolationRuntime,
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    grant = EgressGrant.from_permissions(
        invocation_id="inv-net", tenant_id="tenant_a", network_permissions=[f"127.0.0.1:{port}"]
    )
    async with server:
        reached = await run(
            runtime,
            hostile_tools.connect,
            {"host": "127.0.0.1", "port": port, "use_proxy": True},
            grants=Grants(egress=grant),
        )
        refused = await run(
            runtime,
            hostile_tools.connect,
            {"host": "127.0.0.1", "port": port + 1, "use_proxy": True},
            grants=Grants(egress=grant),
        )
        direct = await run(
            runtime,
            hostile_tools.connect,
            {"host": "127.0.0.1", "port": port},
            grants=Grants(egress=grant),
        )
    assert reached.result == {"text": "200 hello"}
    assert refused.result == {"text": "403 refused"}
    assert code(direct) == ErrorCode.TOOL_EXECUTION_ERROR  # only through the proxy
    decisions = {(r.port, r.decision) for r in AUDIT.records if r.invocation_id == "inv-net"}
    assert (port, EgressDecision.ALLOWED) in decisions
    assert (port + 1, EgressDecision.REFUSED) in decisions


async def test_segfault_is_a_sandbox_failure(runtime: IsolationRuntime) -> None:
    outcome = await run(runtime, hostile_tools.segfault)
    assert code(outcome) == ErrorCode.SANDBOX_FAILURE
    assert outcome.error is not None
    assert "SIGSEGV" in outcome.error.message
    await still_serving(runtime)


async def test_a_gigabyte_on_stdout_is_cut_off(runtime: IsolationRuntime) -> None:
    outcome = await run(runtime, hostile_tools.flood_stdout, timeout_s=30)
    assert code(outcome) == ErrorCode.RESOURCE_EXHAUSTED
    await still_serving(runtime)


async def test_seccomp_denies_ptrace(runtime: IsolationRuntime) -> None:
    outcome = await run(runtime, hostile_tools.ptrace)
    assert outcome.result == {"text": "-1 1"}  # EPERM


async def test_checkpoints_cancel_and_credentials_cross_the_boundary(
    runtime: IsolationRuntime,
) -> None:
    sink = Sink()
    ctx = ToolContext(
        tenant_id="tenant_a",
        agent_did="did:agent:a",
        invocation_id="inv-cp",
        tool_id="hostile__steps",
        tool_version="1.0.0",
        resume_state={"step": 1},
        checkpoints=sink,
    )
    done = await run(runtime, hostile_tools.steps, {"steps": 3}, ctx=ctx)
    assert done.result == {"steps_completed": 3, "resumed_from_step": 1, "secret_length": 0}
    assert [c.state for c in sink.saved] == [{"step": 2}, {"step": 3}]

    cancel = asyncio.Event()
    ctx = ToolContext(
        tenant_id="tenant_a",
        agent_did="did:agent:a",
        invocation_id="inv-cancel",
        tool_id="hostile__steps",
        tool_version="1.0.0",
        checkpoints=Sink(),
        cancel_event=cancel,
    )
    running = asyncio.create_task(
        run(runtime, hostile_tools.steps, {"steps": 1000, "step_seconds": 0.05}, ctx=ctx)
    )
    await asyncio.sleep(0.5)
    cancel.set()
    assert code(await running) == ErrorCode.CANCELLED

    ctx = ToolContext(
        tenant_id="tenant_a",
        agent_did="did:agent:a",
        invocation_id="inv-cred",
        tool_id="hostile__credential",
        tool_version="1.0.0",
        credentials=Credentials(),
    )
    read = await run(runtime, hostile_tools.credential, ctx=ctx)
    assert read.result is not None
    assert read.result["secret_length"] == len("s3cr3t-value")


async def test_process_isolation_keeps_a_blocking_tool_off_the_event_loop(
    runtime: IsolationRuntime,
) -> None:
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticker = asyncio.create_task(tick())
    outcome = await run(
        runtime, hostile_tools.blocking_sleep, isolation=Isolation.PROCESS, timeout_s=1.0
    )
    ticker.cancel()
    assert code(outcome) == ErrorCode.TIMEOUT
    assert ticks >= 10  # the loop kept turning while the tool blocked


async def test_run_python_runs_code_in_its_work_dir_without_network(
    runtime: IsolationRuntime,
) -> None:
    code_ = "import os; print(os.getcwd()); open('f', 'w').write('x'); print(os.listdir('.'))"
    ran = await run(runtime, run_python, {"code": code_})
    assert ran.result == {"stdout": "/home/tool\n['f']\n", "stderr": "", "exit_code": 0}
    net = "import socket; socket.create_connection(('127.0.0.1', 5432), timeout=2)"
    refused = await run(runtime, run_python, {"code": net})
    assert refused.result is not None
    assert refused.result["exit_code"] == 1
    assert "ConnectionRefusedError" in refused.result["stderr"]
    slow = await run(runtime, run_python, {"code": "while True: pass", "timeout_s": 1})
    assert code(slow) == ErrorCode.TIMEOUT
    loud = await run(runtime, run_python, {"code": "print('x' * 3_000_000)"})
    assert loud.result is not None
    assert loud.result["stdout"].endswith("[output truncated]")


async def test_run_python_refuses_to_run_outside_a_sandbox() -> None:
    ctx = ToolContext(
        tenant_id="t",
        agent_did="a",
        invocation_id="i",
        tool_id="core__run_python",
        tool_version="1",
    )
    with pytest.raises(SandboxFailure, match="only inside a sandbox"):
        await run_python(RunPythonInput(code="print(1)"), ctx)


async def test_command_tool_reads_stdin_prints_json_and_checkpoints_on_a_side_channel(
    runtime: IsolationRuntime,
) -> None:
    sink = Sink()
    ctx = ToolContext(
        tenant_id="tenant_a",
        agent_did="did:agent:a",
        invocation_id="inv-cmd",
        tool_id="hostile__words",
        tool_version="1.0.0",
        checkpoints=sink,
    )
    counted = await run(runtime, hostile_tools.words, {"text": "three small words"}, ctx=ctx)
    assert counted.result == {"words": 3}
    assert [c.state for c in sink.saved] == [{"seen": 17}]
    failed = await run(runtime, hostile_tools.words, {"text": "fail"})
    assert code(failed) == ErrorCode.TOOL_EXECUTION_ERROR
    assert failed.error is not None
    assert "status 3" in failed.error.message


async def test_a_cancelled_run_kills_its_sandbox_at_once(runtime: IsolationRuntime) -> None:
    def pooled() -> int:
        return runtime.warm(Isolation.SANDBOX) + runtime.warm(Isolation.PROCESS) + runtime.kept

    async def idle() -> bool:
        return runtime.alive == pooled() >= 2  # only the warm ones

    async def running_one() -> bool:
        return runtime.alive > pooled()

    await eventually(idle, timeout=30)
    ctx = ToolContext(
        tenant_id="tenant_a",
        agent_did="did:agent:a",
        invocation_id="inv-lost-lease",
        tool_id="hostile__blocking_sleep",
        tool_version="1.0.0",
    )
    running = asyncio.create_task(run(runtime, hostile_tools.blocking_sleep, ctx=ctx, timeout_s=60))
    await eventually(running_one, timeout=10)
    running.cancel()  # what a lost lease or the executor's forced cancel does
    with pytest.raises(asyncio.CancelledError):
        await running
    await eventually(idle, timeout=5)  # killed and reaped, far before its 60 s


@pytest.mark.parametrize(("agent_mb", "expected_mb"), [(None, 200), (150, 150)])
async def test_manifest_resource_defaults_set_the_rlimits_below_the_agents(
    runtime: IsolationRuntime, agent_mb: int | None, expected_mb: int
) -> None:
    # ``Sandbox(defaults=ResourceDefaults(memory_mb_limit=200))``: the manifest's default.
    spec = spec_of(hostile_tools.rlimits)
    assert spec.manifest().resource_defaults.memory_mb_limit == 200
    runner = IsolatedRunner(
        runtime=runtime, fleet=FleetLimits(), agent=AgentLimits(memory_mb=agent_mb), grants=Grants()
    )
    ctx = ToolContext(
        tenant_id="tenant_a",
        agent_did="did:agent:a",
        invocation_id="inv-rl",
        tool_id=spec.tool_id,
        tool_version=spec.version,
    )
    outcome = await runner(spec, {}, ctx, 5.0)
    assert outcome.error is None
    assert outcome.result == {"text": str(expected_mb)}


async def test_a_sandboxed_tool_reads_documents_through_the_executors_checks_cache_and_pins(
    runtime: IsolationRuntime,
) -> None:
    source = MemoryDocumentSource()
    source.put("handbook", "rules first edition")
    source.put("faq", "questions")
    cache = DocumentCache(MemoryCacheStore(), source="default", ttl_s=300)
    cache.after_subscribe()
    await eventually(lambda: _trusted(cache))
    context = DocumentContext.model_validate({"documents": [{"document_id": "handbook"}]})
    book = MemoryPinBook()
    call = CallKey(tenant_id="t1", invocation_id="inv-warm")
    warm = CallDocuments(context=context, source=source, pins=book(call), cache=cache)
    await warm.get("handbook")  # the cache now holds version 1
    source.put("handbook", "rules second edition")  # not announced: the cache still says 1
    calls = source.calls

    pins = MemoryDocumentPins()
    docs = CallDocuments(context=context, source=source, pins=pins, cache=cache)
    spec = spec_of(hostile_tools.documents)
    ctx = ToolContext(
        tenant_id="tenant_a",
        agent_did="did:agent:a",
        invocation_id="inv-docs",
        tool_id=spec.tool_id,
        tool_version=spec.version,
        documents=docs,
    )
    outcome = await run(
        runtime, hostile_tools.documents, {"document_id": "handbook", "forbidden": "faq"}, ctx=ctx
    )
    assert outcome.error is None, outcome.error
    assert outcome.result == {
        "text": "1 1 handbook document_access_denied rules first edition"
    }  # cached content and metadata, the search kept to the named document, faq refused
    assert source.calls - calls <= 1  # only the search reached the source
    assert pins.pins == {"handbook": "1"}  # pinned at the first read, as in-process
    assert next((a.document_id, a.version) for a in docs.accessed) == ("handbook", "1")


async def _trusted(cache: DocumentCache) -> bool:
    return cache.trusted


async def test_a_tool_called_again_gets_a_warm_sandbox_of_its_grant_with_its_module_imported(
    runtime: IsolationRuntime, tmp_path: Path
) -> None:
    grants = Grants(binds=parse_filesystem_permissions([str(tmp_path)]))
    call = call_of(hostile_tools.preloaded, grants=grants)
    first = await run(runtime, hostile_tools.preloaded, grants=grants)
    assert first.result == {"text": "imported in the call"}  # a file grant: started cold

    async def kept() -> bool:
        return runtime.warm_for(call)

    assert await eventually(kept, timeout=30)
    second = await run(runtime, hostile_tools.preloaded, grants=grants)
    assert second.result == {"text": "imported before"}
    other = Grants(binds=parse_filesystem_permissions([str(tmp_path), "/etc/ssl"]))
    assert not runtime.warm_for(
        call_of(hostile_tools.preloaded, grants=other)
    )  # another grant shape is another pool: never a sandbox that sees more or less
    await still_serving(runtime)


# --- process workers: forks of the fork server ----------------------------------------


async def test_process_workers_are_fresh_forks_of_the_fork_server(
    runtime: IsolationRuntime,
) -> None:
    """Each call gets a process of its own, forked from one server (no interpreter start
    and SDK import per call)."""
    outcomes = [
        await run(runtime, hostile_tools.whoami, isolation=Isolation.PROCESS) for _ in range(3)
    ]
    pids = {int(o.result["text"].split()[1]) for o in outcomes if o.result is not None}
    assert len(pids) == 3
    zygote = runtime.fork_server_pid
    assert zygote is not None
    # a worker exits after its call; its parent was the fork server, not the executor
    running = asyncio.create_task(
        run(runtime, hostile_tools.blocking_sleep, isolation=Isolation.PROCESS, timeout_s=30)
    )

    async def forked_child() -> bool:
        return any(_parent_of(pid) == zygote for pid in _children_of(zygote))

    try:
        assert await eventually(forked_child, timeout=10)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_a_tools_module_is_imported_once_by_the_fork_server_not_by_each_call(
    runtime: IsolationRuntime,
) -> None:
    """Once a tool was called (a worker is kept warm for it), every worker forked for it
    starts with its module imported by the fork server: still a process per call."""
    call = call_of(hostile_tools.imported_by, isolation=Isolation.PROCESS)
    await run(runtime, hostile_tools.imported_by, isolation=Isolation.PROCESS)

    async def kept() -> bool:
        return runtime.warm_for(call)

    assert await eventually(kept, timeout=30)
    zygote = runtime.fork_server_pid
    workers = set()
    for _ in range(3):  # the kept worker, then workers forked on demand
        outcome = await run(runtime, hostile_tools.imported_by, isolation=Isolation.PROCESS)
        assert outcome.result is not None
        importer, worker = (int(pid) for pid in outcome.result["text"].split())
        assert importer == zygote
        workers.add(worker)
    assert len(workers) == 3
    assert zygote not in workers


async def test_with_no_warm_workers_every_call_is_forked_with_its_module_imported() -> None:
    """The first worker forked for a tool has the fork server import its module."""
    config = RuntimeConfig(warm_sandboxes=0, warm_processes=0, warm_tools=0)
    async with IsolationRuntime(config=config) as cold:
        outcomes = [
            await run(cold, hostile_tools.imported_by, isolation=Isolation.PROCESS)
            for _ in range(3)
        ]
        zygote = cold.fork_server_pid
    pids = [tuple(int(p) for p in o.result["text"].split()) for o in outcomes if o.result]
    assert [importer for importer, _ in pids] == [zygote] * 3
    assert len({worker for _, worker in pids}) == 3


@pytest.mark.parametrize(
    ("tool", "overrides", "expected", "message"),
    [
        (hostile_tools.busy_loop, {"timeout_s": 1.5, "cpu_seconds": 30}, "timeout", ""),
        (hostile_tools.busy_loop, {"timeout_s": 30, "cpu_seconds": 1}, "timeout", "CPU"),
        (hostile_tools.memory_hog, {"memory_mb": 256}, "resource_exhausted", ""),
        (hostile_tools.segfault, {}, "sandbox_failure", "SIGSEGV"),
        (hostile_tools.flood_stdout, {"timeout_s": 30}, "resource_exhausted", ""),
    ],
)
async def test_a_forked_process_worker_is_held_to_its_limits(
    runtime: IsolationRuntime,
    tool: Any,
    overrides: dict[str, Any],
    expected: str,
    message: str,
) -> None:
    outcome = await run(runtime, tool, isolation=Isolation.PROCESS, **overrides)
    assert code(outcome) == expected
    assert outcome.error is not None
    assert message in outcome.error.message
    if tool is hostile_tools.memory_hog:
        assert 100 <= outcome.usage.memory_peak_mb <= 300
    if tool is hostile_tools.busy_loop:
        assert outcome.usage.cpu_millicore_seconds >= 100  # it did spin
    still = await run(runtime, hostile_tools.echo, {"text": "next"}, isolation=Isolation.PROCESS)
    assert still.result == {"text": "next"}


def _children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(c) for c in handle.read().split()]
    except OSError:
        return []


def _parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


async def test_a_fork_server_that_died_is_started_again(runtime: IsolationRuntime) -> None:
    await run(runtime, hostile_tools.echo, {"text": "up"}, isolation=Isolation.PROCESS)
    zygote = runtime.fork_server_pid
    assert zygote is not None
    os.kill(zygote, signal.SIGKILL)

    async def noticed() -> bool:
        return runtime.fork_server_pid != zygote

    await eventually(noticed, timeout=5)
    # Its warm worker died with it (a call that had one fails as sandbox_failure); the
    # next workers come from a new server.
    for text in ("one", "two", "three"):
        outcome = await run(
            runtime, hostile_tools.echo, {"text": text}, isolation=Isolation.PROCESS
        )
        assert outcome.result == {"text": text}
    assert runtime.fork_server_pid not in (None, zygote)


# Issue 32: calls of the same class as ptrace that the filter lacked; each made with
# arguments the kernel itself would answer without EPERM.
DENIED_PROBES = [name for name in sandbox_probes.SYSCALLS if name != "getpid"]


async def test_seccomp_denies_io_uring_ldt_fanotify_and_page_migration(
    runtime: IsolationRuntime,
) -> None:
    names = [*DENIED_PROBES, "getpid"]
    outcome = await run(runtime, sandbox_probes.syscalls, {"names": names})
    assert outcome.result is not None, outcome.error
    answers = json.loads(outcome.result["text"])
    refused = {name: answer for name, answer in answers.items() if name != "getpid"}
    assert refused == {name: [-1, errno.EPERM] for name in refused}
    assert answers["getpid"][0] > 0  # the probe itself works
    await still_serving(runtime)


async def test_a_sandboxed_tool_trusts_the_system_ca_bundle(runtime: IsolationRuntime) -> None:
    outcome = await run(runtime, sandbox_probes.ca_bundle)
    assert outcome.result is not None, outcome.error
    assert int(outcome.result["text"]) > 0


async def test_an_agent_asking_more_than_the_fleet_runs_under_the_fleets_limit(
    runtime: IsolationRuntime,
) -> None:
    """Issue 32, attack 6 (defence in depth): an authorized event whose agent limits are
    above the fleet's still runs under no more than the fleet's (policy refuses it first)."""
    spec = spec_of(sandbox_probes.address_space)
    runner = IsolatedRunner(
        runtime=runtime,
        fleet=FleetLimits(memory_mb=384),
        agent=AgentLimits(memory_mb=8192, cpu_millicores=64_000),
        grants=Grants(),
    )
    ctx = ToolContext(
        tenant_id="tenant_a",
        agent_did="did:agent:a",
        invocation_id="inv-raise",
        tool_id=spec.tool_id,
        tool_version=spec.version,
    )
    outcome = await runner(spec, {}, ctx, 5.0)
    assert outcome.error is None, outcome.error
    assert outcome.result == {"text": "384"}
