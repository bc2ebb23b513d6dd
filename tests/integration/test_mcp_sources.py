"""MCP tool sources against real MCP servers (the ``mcp`` SDK), stdio and HTTP.

The test server (``tests/support/source_servers.py``) misbehaves on demand: it crashes
mid-call, hangs, answers malformed results and adds a tool at run time. Calls run
through the executor's own runner with the provider's specs, as a worker runs them.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support.eventually import eventually
from tests.support.servers import free_port, kill_quietly, wait_for_port
from tests.support.source_servers import sandbox_state
from toolfleet.contract.manifest import LifecycleState
from toolfleet.devstack.children import child_preexec
from toolfleet.errors import ErrorCode
from toolfleet.executor.runner import RunResult, run_tool
from toolfleet.isolation.egress import EgressDecision, EgressProxy, MemoryEgressAudit
from toolfleet.isolation.sandbox import probe
from toolfleet.isolation.stdio import StdioSandbox
from toolfleet.policy.documents import allowed_by
from toolfleet.registry.store import RegistryStore
from toolfleet.secrets.store import Secret
from toolfleet.sources.models import SourceDefinition, SourceKind, SourceTool
from toolfleet.sources.pool import SessionPool
from toolfleet.sources.provider import SourceCatalog, SourceToolProvider, secret_credentials
from toolfleet.sources.store import SourceStore
from toolfleet.storage.postgres import create_pool
from toolfleet.tools.context import CheckpointInput, ToolContext

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EGRESS = MemoryEgressAudit()
#: The uid sandboxed servers run as when the tests run as root.
SERVER_UID = 199_999


class Appeared:
    def __init__(self) -> None:
        self.tools: list[SourceTool] = []

    async def tool_appeared(self, tool: SourceTool) -> None:
        self.tools.append(tool)


class Checkpoints:
    def __init__(self) -> None:
        self.saved: list[CheckpointInput] = []

    async def save(self, checkpoint: CheckpointInput) -> str:
        self.saved.append(checkpoint)
        return str(uuid.uuid4())


class Secrets:
    """The executor's secret store, for the sources' own credentials."""

    async def resolve(self, tenant_id: str, connection_id: str, name: str) -> Secret:
        assert (tenant_id, connection_id, name) == ("tenant_a", "gh_conn", "token")
        return Secret("s3cr3t-value")


class Fleet:
    """A sources store, catalog and provider over one database, as an executor has them."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.store = SourceStore(pool)
        self.registry = RegistryStore(pool)
        # stdio servers run sandboxed, as an executor that can run sandboxes starts them.
        support = probe()
        assert support.sandboxes, support.problem
        self.sandbox = StdioSandbox(support=support, uid=SERVER_UID)
        self.sessions = SessionPool(
            credentials=secret_credentials(Secrets()), launcher=self.sandbox
        )
        self.audit = Appeared()
        self.catalog = SourceCatalog(store=self.store, pool=self.sessions, audit=self.audit)
        self.sessions.on_tools_changed = self.catalog.on_tools_changed
        self.provider = SourceToolProvider(lookup=self.store, pool=self.sessions)

    async def add(self, source: SourceDefinition) -> list[SourceTool]:
        await self.store.put(source)
        return (await self.catalog.refresh(source)).added

    async def call(
        self,
        tool_id: str,
        parameters: dict[str, Any],
        *,
        tenant: str = "tenant_a",
        timeout_s: float | None = None,
        cancel: asyncio.Event | None = None,
        checkpoints: Checkpoints | None = None,
    ) -> RunResult:
        version = (await self.registry.versions(tool_id))[0].version
        spec = await self.provider.spec(tool_id, version)
        assert spec is not None
        ctx = ToolContext(
            tenant_id=tenant,
            agent_did="did:agent:test",
            invocation_id=str(uuid.uuid4()),
            tool_id=tool_id,
            tool_version=version,
            cancel_event=cancel,
            checkpoints=checkpoints,
        )
        # The executor's budget unless a test sets one: the tool's own timeout (its
        # source's ``timeout_s``), which counts starting the server when its session is
        # closed. A sandboxed server on the Python SDK spends ~2 s of CPU importing it;
        # under four test workers on two cores a cold start took over 10 s.
        limit = spec.timeout_seconds if timeout_s is None else timeout_s
        return await run_tool(spec, parameters, ctx, timeout_s=limit)


@pytest.fixture
async def fleet(database_url: str) -> AsyncIterator[Fleet]:
    pool = await create_pool(database_url)
    made = Fleet(pool)
    try:
        async with EgressProxy(audit=EGRESS) as proxy:
            made.sandbox.egress = proxy
            yield made
    finally:
        await made.provider.close()
        await pool.close()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "server"


def stdio_source(state: Path, **extra: Any) -> SourceDefinition:
    """A source of the test server; its state dir is the one host path it may write."""
    name = f"s{uuid.uuid4().hex[:8]}"
    command = f"{sys.executable} -m tests.support.source_servers {state}"
    sandbox_state(state)
    extra.setdefault("filesystem_permissions", [f"rw:{state}"])
    return SourceDefinition(name=name, kind=SourceKind.MCP_STDIO, target=command, **extra)


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    argv = [sys.executable, "-m", "tests.support.source_servers", str(tmp_path / "http")]
    proc = subprocess.Popen(
        [*argv, "--http", "--port", str(port)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=child_preexec,
    )
    try:
        wait_for_port("127.0.0.1", port)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        kill_quietly(proc)


def text_of(result: RunResult) -> str:
    assert result.error is None, result.error
    assert result.result is not None
    return " ".join(block["text"] for block in result.result["content"])


async def test_stdio_tools_are_registered_by_schema_and_called(fleet: Fleet, state: Path) -> None:
    source = stdio_source(state)
    added = await fleet.add(source)
    ids = {t.tool_id for t in added}
    assert f"mcp__{source.name}__add" in ids
    assert f"mcp__{source.name}__hang" in ids
    add = next(t for t in added if t.remote_name == "add")
    assert add.version.startswith("1.0.0+h")
    [manifest] = await fleet.registry.versions(add.tool_id)
    assert manifest.redaction_allowlist == ["content"]  # none set: only the text passes
    assert manifest.lifecycle_state is LifecycleState.ACTIVE

    assert text_of(await fleet.call(add.tool_id, {"a": 2, "b": 3})) == "sum=5"
    refused = await fleet.call(add.tool_id, {"a": "two"})
    assert refused.error is not None
    assert refused.error.code is ErrorCode.INVALID_PARAMETERS
    # The same listing again registers nothing new: the version is the schema's.
    assert (await fleet.catalog.refresh(source)).added == []


async def test_a_changed_schema_is_a_new_version_and_the_old_one_is_deprecated(
    fleet: Fleet, state: Path
) -> None:
    source = stdio_source(state)
    add = next(t for t in await fleet.add(source) if t.remote_name == "add")
    changed = add.model_copy(
        update={
            "input_schema": {**add.input_schema, "description": "v2"},
            "version": "1.0.0+hchanged00001",
        }
    )
    recorded = await fleet.store.record([changed], via="refresh")
    assert recorded.added == [changed]
    assert recorded.new_tools == []  # a new version of a known tool, not a new tool
    states = {m.version: m.lifecycle_state for m in await fleet.registry.versions(add.tool_id)}
    assert states == {
        add.version: LifecycleState.DEPRECATED,
        changed.version: LifecycleState.ACTIVE,
    }


async def test_progress_becomes_checkpoints(fleet: Fleet, state: Path) -> None:
    source = stdio_source(state)
    await fleet.add(source)
    checkpoints = Checkpoints()
    result = await fleet.call(f"mcp__{source.name}__count", {"steps": 3}, checkpoints=checkpoints)
    assert text_of(result) == "counted 3"
    assert [round(c.progress_percent) for c in checkpoints.saved] == [33, 67, 100]
    assert checkpoints.saved[-1].current_phase == "step 3"


async def test_tool_errors_and_malformed_results_are_typed(fleet: Fleet, state: Path) -> None:
    source = stdio_source(state)
    await fleet.add(source)
    failed = await fleet.call(f"mcp__{source.name}__fail", {})
    assert failed.error is not None
    assert failed.error.code is ErrorCode.TOOL_EXECUTION_ERROR
    assert failed.error.retryable is False
    assert "secret sauce" not in failed.error.model_dump_json()  # the server's text stays out

    malformed = await fleet.call(f"mcp__{source.name}__malformed", {})
    assert malformed.error is not None
    assert malformed.error.code is ErrorCode.RESULT_VALIDATION_FAILED
    # A bad answer is not a crash: the same server process answers the next call.
    assert text_of(await fleet.call(f"mcp__{source.name}__add", {"a": 1, "b": 1})) == "sum=2"
    assert len((state / "starts").read_text().split()) == 1


async def test_a_crash_mid_call_is_retryable_and_the_server_is_restarted(
    fleet: Fleet, state: Path
) -> None:
    source = stdio_source(state)
    await fleet.add(source)
    crashed = await fleet.call(f"mcp__{source.name}__crash", {})
    assert crashed.error is not None
    assert crashed.error.code is ErrorCode.EXTERNAL_API_ERROR
    assert crashed.error.retryable is True
    assert text_of(await fleet.call(f"mcp__{source.name}__add", {"a": 4, "b": 4})) == "sum=8"
    assert len((state / "starts").read_text().split()) == 2


async def test_a_hanging_call_times_out_and_the_server_is_told(fleet: Fleet, state: Path) -> None:
    source = stdio_source(state)
    await fleet.add(source)
    hung = await fleet.call(f"mcp__{source.name}__hang", {}, timeout_s=0.5)
    assert hung.error is not None
    assert hung.error.code is ErrorCode.TIMEOUT

    async def told() -> bool:
        return (state / "cancelled").exists()

    assert await eventually(told, timeout=10)


async def test_a_fleet_cancel_sends_cancelled_to_the_server(fleet: Fleet, state: Path) -> None:
    source = stdio_source(state)
    await fleet.add(source)
    cancel = asyncio.Event()
    call = asyncio.create_task(fleet.call(f"mcp__{source.name}__hang", {}, cancel=cancel))

    async def hanging() -> bool:
        return (state / "hanging").exists()

    assert await eventually(hanging, timeout=10)
    cancel.set()
    result = await asyncio.wait_for(call, 10)
    assert result.error is not None
    assert result.error.code is ErrorCode.CANCELLED

    async def told() -> bool:
        return (state / "cancelled").exists()

    assert await eventually(told, timeout=10)


async def test_a_tool_added_at_run_time_is_registered_but_no_glob_allows_it(
    fleet: Fleet, state: Path
) -> None:
    source = stdio_source(state)
    await fleet.add(source)
    late = f"mcp__{source.name}__late"
    assert text_of(await fleet.call(f"mcp__{source.name}__grow", {})) == "grown"

    async def registered() -> bool:
        return bool(await fleet.registry.versions(late))

    assert await eventually(registered, timeout=10)

    # The record is visible before it is audited: the source's rules are restated in
    # between (Postgres round trips), so a slow box saw an empty audit here.
    async def audited() -> bool:
        return bool(fleet.audit.tools)

    assert await eventually(audited, timeout=10)
    assert [t.tool_id for t in fleet.audit.tools] == [late]
    assert not allowed_by(late, ["*", "mcp__*", f"mcp__{source.name}__*"])
    assert allowed_by(late, [late])
    assert allowed_by("core__echo", ["*"])


async def test_an_idle_session_is_closed_and_reopened_on_demand(fleet: Fleet, state: Path) -> None:
    source = stdio_source(state, idle_s=0.3)
    await fleet.add(source)
    session = fleet.sessions.session(source)

    async def closed() -> bool:
        return not session.running

    assert await eventually(closed, timeout=10)  # the listing's session went idle
    add = f"mcp__{source.name}__add"
    # A call whose budget ends while the server starts times out, retryable; the start
    # goes on, and the retry finds that server rather than starting another.
    early = await fleet.call(add, {"a": 1, "b": 1}, timeout_s=0.05)
    assert early.error is not None
    assert early.error.code is ErrorCode.TIMEOUT
    assert early.error.retryable
    assert text_of(await fleet.call(add, {"a": 1, "b": 1})) == "sum=2"
    assert await eventually(closed, timeout=10)
    assert len((state / "starts").read_text().split()) == 2  # listing, then the calls


async def test_a_stdio_server_gets_its_credentials_and_nothing_else(
    fleet: Fleet, state: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SOURCE_TOKEN", "the executor's own, never passed on")
    bare = stdio_source(state)
    await fleet.add(bare)
    assert text_of(await fleet.call(f"mcp__{bare.name}__token_length", {})) == "length=0"
    source = stdio_source(
        state,
        tenant_id="tenant_a",
        connection_id="gh_conn",
        credential_env={"SOURCE_TOKEN": "token"},
    )
    await fleet.add(source)
    result = await fleet.call(f"mcp__{source.name}__token_length", {})
    assert text_of(result) == f"length={len('s3cr3t-value')}"


async def test_a_sandboxed_stdio_server_sees_neither_host_secrets_nor_other_dirs(
    fleet: Fleet, state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLFLEET_TEST_EXECUTOR_SECRET", "executor-only")
    source = stdio_source(state)
    await fleet.add(source)

    async def run(tool: str, path: str) -> str:
        return text_of(await fleet.call(f"mcp__{source.name}__{tool}", {"path": path}))

    for path in ("/proc/1/environ", f"/proc/{os.getpid()}/environ", "/etc/shadow"):
        seen = await run("read_path", path)
        assert "executor-only" not in seen, path
        assert "TOOLFLEET_" not in seen, path
    outside = tmp_path / "outside"
    outside.mkdir()
    for path in (str(outside / "pwned"), "/usr/pwned", "/etc/pwned", f"{REPO}/pwned"):
        assert (await run("write_path", path)).startswith("refused:"), path
    assert not (outside / "pwned").exists()
    assert not (REPO / "pwned").exists()
    assert await run("write_path", str(state / "mine")) == "written"  # its own dir
    assert (state / "mine").read_text() == "pwned"
    assert await run("write_path", "/home/tool/scratch") == "written"  # its work dir


async def test_a_sandboxed_stdio_server_reaches_only_its_granted_hosts_through_the_proxy(
    fleet: Fleet, state: Path
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    granted = stdio_source(state, network_permissions=[f"127.0.0.1:{port}"])
    closed = stdio_source(state / "closed")
    await fleet.add(granted)
    await fleet.add(closed)

    async def fetch(source: SourceDefinition, port: int) -> str:
        url = f"http://127.0.0.1:{port}/"
        return text_of(await fleet.call(f"mcp__{source.name}__fetch", {"url": url}))

    async with server:
        assert await fetch(granted, port) == "200 hello"
        assert await fetch(granted, port + 1) == "403 refused"
        assert (await fetch(closed, port)).startswith("failed:")  # no network at all
    decisions = {(r.port, r.decision) for r in EGRESS.records}
    assert (port, EgressDecision.ALLOWED) in decisions
    assert (port + 1, EgressDecision.REFUSED) in decisions


async def test_a_source_of_another_tenant_is_refused(fleet: Fleet, state: Path) -> None:
    source = stdio_source(state, tenant_id="tenant_a")
    await fleet.add(source)
    refused = await fleet.call(f"mcp__{source.name}__add", {"a": 1, "b": 2}, tenant="tenant_b")
    assert refused.error is not None
    assert refused.error.code is ErrorCode.PERMISSION_DENIED


async def test_streamable_http_server(fleet: Fleet, http_server: str) -> None:
    name = f"h{uuid.uuid4().hex[:8]}"
    source = SourceDefinition(name=name, kind=SourceKind.MCP_HTTP, target=http_server)
    added = await fleet.add(source)
    assert f"mcp__{name}__add" in {t.tool_id for t in added}
    assert text_of(await fleet.call(f"mcp__{name}__add", {"a": 20, "b": 22})) == "sum=42"
    assert await fleet.store.remove(name)
    [manifest] = await fleet.registry.versions(f"mcp__{name}__add")
    assert manifest.lifecycle_state is LifecycleState.REMOVED
