"""Runs one tool call in a worker process or a sandbox, and reports what it used.

:class:`IsolationRuntime` owns the warm pools, the slots (one uid each) and the egress
proxy sessions. :meth:`IsolationRuntime.run` sends the job, answers the worker's RPC
calls with the executor's real :class:`~toolfleet.tools.context.ToolContext` (checkpoints,
credentials), forwards a cancel, and enforces the wall clock: at the timeout the
process group gets SIGTERM, and SIGKILL after the grace period. A cancelled run (an
executor cancel after its grace, a lost lease, shutdown) kills the group at once.

Failures map to the contract's codes:

    wall clock or RLIMIT_CPU (SIGXCPU)       timeout
    MemoryError under RLIMIT_AS              resource_exhausted
    stdout + stderr over the limit           resource_exhausted
    worker died without an answer (SIGSEGV,  sandbox_failure (the signal is named)
    SIGKILL, ...), or never became ready
    the tool raised                          its own code, or tool_execution_error
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import tempfile
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from toolfleet.errors import SandboxFailure, ToolfleetError
from toolfleet.isolation import seccomp
from toolfleet.isolation.bridge import PROXY_URL
from toolfleet.isolation.drive import drive
from toolfleet.isolation.egress import EgressGrant, EgressProxy
from toolfleet.isolation.protocol import JobLimits, RunJob
from toolfleet.isolation.run_states import IsolatedResult, Usage
from toolfleet.isolation.sandbox import (
    EGRESS_SOCKET,
    WORKDIR,
    Bind,
    HostSupport,
    SandboxPlan,
    bwrap_argv,
    import_paths,
    probe,
)
from toolfleet.isolation.worker import Worker, worker_command
from toolfleet.isolation.zygote import ForkServer
from toolfleet.tools.context import ToolContext
from toolfleet.tools.limits import Isolation, RunLimits

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeConfig:
    """The runtime's knobs (the executor builds it from ``TOOLFLEET_ISOLATION_*``)."""

    warm_sandboxes: int = 2
    """Sandboxes started ahead, waiting for a call without file or network grants."""
    warm_processes: int = 1
    """Worker processes started ahead for ``process`` tools."""
    warm_tools: int = 8
    """Tools (id, code, isolation and file grants) that keep a warm worker of their own,
    their module already imported; the least recently called beyond this is dropped."""
    max_workers: int = 64
    """Workers alive at once (warm ones included); one more call waits for a slot."""
    uid_base: int = 200_000
    """When root: the sandbox in slot ``n`` runs as uid ``uid_base + n``."""
    fork_server: bool = True
    """Fork ``process`` workers from a server with the SDK imported
    (:mod:`toolfleet.isolation.zygote`) instead of starting an interpreter for each."""
    start_timeout_s: float = 30.0
    """A worker not ready this long after its start is a ``sandbox_failure``."""
    workdir_mb: int = 64
    """Size of a sandbox's tmpfs work dir."""
    seccomp: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class Grants:
    """What the token grants the sandbox (bound into policy's signed grant)."""

    binds: tuple[Bind, ...] = ()
    egress: EgressGrant | None = None

    @property
    def empty(self) -> bool:
        return not self.binds and (self.egress is None or not self.egress.allows_network)


@dataclass(frozen=True, slots=True, kw_only=True)
class PoolKey:
    """What a warm worker kept for one tool was started for: a call matching it exactly
    (same tool code, runtime and bound paths; no network) may take it."""

    isolation: Isolation
    tool_id: str
    target: str
    binds: tuple[Bind, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class IsolatedCall:
    """One call for :meth:`IsolationRuntime.run`."""

    isolation: Isolation
    tool_id: str
    target: str = ""
    """``module:qualname`` of a Python tool."""
    command: tuple[str, ...] = ()
    """The executable and its arguments, for a command tool."""
    parameters: dict[str, Any]
    limits: RunLimits
    grants: Grants = field(default_factory=Grants)
    credentials: bool = False

    @property
    def pool_key(self) -> PoolKey | None:
        """The warm pool of its own this call can use; None: a command or network call
        (an egress session is bound to one invocation, so its sandbox starts with it)."""
        if self.command or not self.target:
            return None
        if self.grants.egress is not None and self.grants.egress.allows_network:
            return None
        return PoolKey(
            isolation=self.isolation,
            tool_id=self.tool_id,
            target=self.target,
            binds=self.grants.binds,
        )


class IsolationRuntime:
    """Workers and sandboxes for one executor. ``async with IsolationRuntime(...)``."""

    def __init__(
        self,
        *,
        config: RuntimeConfig | None = None,
        egress: EgressProxy | None = None,
        support: HostSupport | None = None,
    ) -> None:
        self.config = config or RuntimeConfig()
        self.egress = egress
        self.support = support or probe()
        self._free_slots = asyncio.Queue[int]()
        for slot in range(self.config.max_workers):
            self._free_slots.put_nowait(slot)
        self._warm: dict[Isolation, asyncio.Queue[Worker]] = {
            Isolation.SANDBOX: asyncio.Queue(),
            Isolation.PROCESS: asyncio.Queue(),
        }
        self._keyed: OrderedDict[PoolKey, Worker | None] = OrderedDict()
        """One warm worker per recently called tool (None while it starts)."""
        self._keying: set[PoolKey] = set()
        self._refills: set[asyncio.Task[None]] = set()
        self._socket_dir = tempfile.mkdtemp(prefix="toolfleet-egress-")
        self._seccomp = (
            seccomp.compile_filter() if self.config.seccomp and self.support.sandboxes else None
        )
        self._imports = import_paths()
        self._closed = False
        self._zygote: ForkServer | None = None
        self._zygote_lock = asyncio.Lock()

    @property
    def sandboxes(self) -> bool:
        """Whether sandboxes can run on this host."""
        return self.support.sandboxes

    async def __aenter__(self) -> IsolationRuntime:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Fill the warm pools."""
        for isolation, size in (
            (Isolation.SANDBOX, self.config.warm_sandboxes if self.sandboxes else 0),
            (Isolation.PROCESS, self.config.warm_processes),
        ):
            for _ in range(size):
                self._refill(isolation)

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._refills):
            task.cancel()
        await asyncio.gather(*self._refills, return_exceptions=True)
        for queue in self._warm.values():
            while not queue.empty():
                worker = queue.get_nowait()
                await self._release(worker)
        keyed, self._keyed = list(self._keyed.values()), OrderedDict()
        for kept in keyed:
            if kept is not None:
                await self._release(kept)
        if self._zygote is not None:
            await self._zygote.close()
        with contextlib.suppress(OSError):
            os.rmdir(self._socket_dir)

    def warm(self, isolation: Isolation) -> int:
        """Workers waiting in the pool of ``isolation``."""
        return self._warm[isolation].qsize()

    @property
    def kept(self) -> int:
        """Warm workers waiting for one tool each (``warm_tools`` pools)."""
        return sum(1 for worker in self._keyed.values() if worker is not None)

    def warm_for(self, call: IsolatedCall) -> bool:
        """Whether a warm worker kept for ``call``'s tool and grants is waiting."""
        key = call.pool_key
        return key is not None and self._keyed.get(key) is not None

    @property
    def fork_server_pid(self) -> int | None:
        """The fork server's pid while it runs (``process`` workers are its children)."""
        zygote = self._zygote
        return zygote.pid if zygote is not None and zygote.running else None

    @property
    def alive(self) -> int:
        """Workers alive now (warm ones included), each holding a slot."""
        return self.config.max_workers - self._free_slots.qsize()

    async def run(self, call: IsolatedCall, ctx: ToolContext) -> IsolatedResult:
        """Run ``call`` with ``ctx``'s identities, checkpoints, cancel and credentials."""
        if call.isolation is Isolation.SANDBOX and not self.sandboxes:
            return _failed(SandboxFailure(f"no sandbox on this host: {self.support.problem}"))
        async with AsyncExitStack() as stack:
            egress_host: str | None = None
            if call.grants.egress is not None and call.grants.egress.allows_network:
                egress_host = await stack.enter_async_context(self._egress(call))
            try:
                worker = await self._worker(call, egress_host)
            except ToolfleetError as exc:
                return _failed(exc)
            stack.callback(self._release_later, worker)
            return await self._drive(call, ctx, worker, egress_host is not None)
        raise AssertionError("unreachable")  # pragma: no cover

    # --- workers ----------------------------------------------------------------------

    async def _worker(self, call: IsolatedCall, egress_host: str | None) -> Worker:
        key = call.pool_key
        if key is not None:
            kept = self._keyed.get(key)
            self._refill_key(key)  # the next call of this tool finds one again
            if kept is not None and not kept.exited.done():
                return kept
            if kept is not None:
                await self._release(kept)
        pool = self._warm[call.isolation]
        if call.grants.empty and not pool.empty():
            worker = pool.get_nowait()
            self._refill(call.isolation)
            if not worker.exited.done():
                return worker
            await self._release(worker)
        return await self._start(
            call.isolation, call.grants.binds, egress_host, server_import=_module_of(call)
        )

    def _refill_key(self, key: PoolKey) -> None:
        """Start a warm worker kept for ``key`` (its module imported), in place of the
        one taken; the least recently called key beyond ``warm_tools`` is dropped."""
        if self._closed or self.config.warm_tools <= 0:
            return
        if key.isolation is Isolation.SANDBOX and not self.sandboxes:
            return
        self._keyed[key] = None
        self._keyed.move_to_end(key)
        if key in self._keying:
            return  # one is starting already
        while len(self._keyed) > self.config.warm_tools:
            _, dropped = self._keyed.popitem(last=False)
            if dropped is not None:
                self._release_later(dropped)

        async def refill() -> None:
            try:
                worker = await self._start(
                    key.isolation, key.binds, None, preload=key.target.partition(":")[0]
                )
            except Exception as exc:
                log.warning("warm worker did not start: %s", exc)
                self._keyed.pop(key, None)
                return
            finally:
                self._keying.discard(key)
            if self._closed or key not in self._keyed or self._keyed[key] is not None:
                await self._release(worker)  # dropped meanwhile, or another one is there
            else:
                self._keyed[key] = worker

        self._keying.add(key)
        task = asyncio.create_task(refill())
        self._refills.add(task)
        task.add_done_callback(self._refills.discard)

    async def _start(
        self,
        isolation: Isolation,
        binds: tuple[Bind, ...],
        egress_host: str | None,
        *,
        preload: str = "",
        server_import: str = "",
    ) -> Worker:
        slot = await self._free_slots.get()
        try:
            if isolation is Isolation.SANDBOX:
                uid = self.config.uid_base + slot if self.support.root else None
                plan = SandboxPlan(
                    binds=binds,
                    egress_socket=egress_host,
                    workdir_mb=self.config.workdir_mb,
                    import_paths=self._imports,
                )
                argv = bwrap_argv(
                    support=self.support,
                    plan=plan,
                    worker=worker_command(
                        uid=uid, workdir=WORKDIR, preload=preload, sys_path=_sys_path()
                    ),
                    seccomp=self._seccomp is not None,
                )
                if egress_host is not None and uid is not None:
                    os.chown(egress_host, uid, uid)  # the sandbox's uid may connect
                filter_fd = seccomp.filter_fd(self._seccomp) if self._seccomp else None
                try:
                    worker = await Worker.spawn(argv, slot=slot, seccomp_fd=filter_fd)
                finally:
                    if filter_fd is not None:
                        os.close(filter_fd)
            else:
                forked = await self._forked(slot, preload, server_import or preload)
                if forked is not None:
                    worker = forked
                else:
                    command = worker_command(
                        uid=None, workdir=None, preload=preload, sys_path=_sys_path()
                    )
                    worker = await Worker.spawn(command, slot=slot)
        except BaseException:
            self._free_slots.put_nowait(slot)
            raise
        try:
            await worker.ready(self.config.start_timeout_s)
        except BaseException:
            await self._release(worker)
            raise
        return worker

    async def _forked(self, slot: int, preload: str, server_import: str) -> Worker | None:
        """A ``process`` worker forked from the fork server (started on first use, again
        after it died); None when there is none: the caller starts an interpreter."""
        if not self.config.fork_server or self._closed:
            return None
        async with self._zygote_lock:
            if self._zygote is None or not self._zygote.running:
                if self._zygote is not None:
                    await self._zygote.close()  # reaps the one that died
                zygote = ForkServer(start_timeout_s=self.config.start_timeout_s)
                try:
                    await zygote.start()
                except SandboxFailure as exc:
                    log.warning("no fork server, workers start as interpreters: %s", exc)
                    return None
                self._zygote = zygote
            zygote = self._zygote
        try:
            return await zygote.fork(
                slot=slot,
                preload=preload,
                sys_path=os.pathsep.join(_sys_path()),
                server_import=server_import,
            )
        except SandboxFailure as exc:
            log.warning("fork server failed, starting an interpreter: %s", exc)
            return None

    def _refill(self, isolation: Isolation) -> None:
        if self._closed:
            return

        async def refill() -> None:
            try:
                worker = await self._start(isolation, (), None)
            except Exception as exc:
                log.warning("warm worker did not start: %s", exc)
                return
            if self._closed:
                await self._release(worker)
            else:
                self._warm[isolation].put_nowait(worker)

        task = asyncio.create_task(refill())
        self._refills.add(task)
        task.add_done_callback(self._refills.discard)

    def _release_later(self, worker: Worker) -> None:
        """Kill, reap and free the slot after the call returned (a worker that answered
        exits by itself; nobody waits for that)."""
        task = asyncio.create_task(self._release(worker))
        self._refills.add(task)
        task.add_done_callback(self._refills.discard)

    async def _release(self, worker: Worker) -> None:
        try:
            await worker.close()
        finally:
            self._free_slots.put_nowait(worker.slot)

    @asynccontextmanager
    async def _egress(self, call: IsolatedCall) -> AsyncIterator[str]:
        grant = call.grants.egress
        assert grant is not None
        if self.egress is None:
            raise SandboxFailure("network granted but the executor runs no egress proxy")
        # A call is (tenant, invocation): two tenants' calls of one id get two sockets.
        # Hashed: a socket path must stay under ~100 bytes whatever the tenant id's length.
        name = f"{grant.tenant_id}\x1f{grant.invocation_id}".encode()
        path = os.path.join(self._socket_dir, f"{hashlib.sha256(name).hexdigest()[:32]}.sock")
        async with self.egress.session(grant, unix_path=_path(path)):
            yield path

    # --- one run ----------------------------------------------------------------------

    async def _drive(
        self, call: IsolatedCall, ctx: ToolContext, worker: Worker, network: bool
    ) -> IsolatedResult:
        return await drive(job=_job(call, ctx, network), limits=call.limits, ctx=ctx, worker=worker)


def _job(call: IsolatedCall, ctx: ToolContext, network: bool) -> RunJob:
    """The job the worker runs: the call, its limits, environment and identities."""
    limits = call.limits
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    if call.isolation is Isolation.SANDBOX:
        env.update(HOME=WORKDIR, TOOLFLEET_SANDBOX="1")
    if network:
        env.update(HTTPS_PROXY=PROXY_URL, HTTP_PROXY=PROXY_URL)
        env.update(https_proxy=PROXY_URL, http_proxy=PROXY_URL)
    return RunJob(
        tool_id=call.tool_id,
        target=call.target,
        command=list(call.command),
        parameters=call.parameters,
        limits=JobLimits(
            cpu_seconds=limits.cpu_seconds,
            memory_mb=limits.memory_mb,
            max_processes=limits.max_processes,
            max_file_mb=limits.max_file_mb,
            max_open_files=limits.max_open_files,
            max_output_bytes=limits.max_output_bytes,
        ),
        env=env,
        sys_path=_sys_path(),
        egress_socket=EGRESS_SOCKET if network else None,
        tenant_id=ctx.tenant_id,
        agent_did=ctx.agent_did,
        invocation_id=ctx.invocation_id,
        tool_version=ctx.tool_version,
        attempt=ctx.attempt,
        resume_state=ctx.resume_state(),
        checkpointing=ctx._checkpoints is not None,
        credentials=call.credentials,
        connection_id=ctx.connection_id,
    )


def _failed(exc: ToolfleetError) -> IsolatedResult:
    return IsolatedResult(error=exc.to_error_info())


def _module_of(call: IsolatedCall) -> str:
    """The module of a Python tool's call (the fork server imports it for the workers
    it forks), empty for a command."""
    if call.command or not call.target:
        return ""
    return call.target.partition(":")[0]


def _sys_path() -> list[str]:
    import sys

    return [p for p in sys.path if p and os.path.isabs(p)]


def _path(text: str) -> Any:
    from pathlib import Path

    return Path(text)


__all__ = [
    "Grants",
    "IsolatedCall",
    "IsolatedResult",
    "IsolationRuntime",
    "PoolKey",
    "RuntimeConfig",
    "Usage",
]
