"""One worker process as the executor holds it: spawn, RPC socket, output drain, reaping.

Spawned with ``posix_spawn`` (or forked by the fork server, :mod:`toolfleet.isolation.zygote`)
in a session (process group) of its own; its RPC socket is its fd 3, the seccomp filter
its fd 4, stdout and stderr one socket the executor drains and counts (never logs:
output may hold anything). Reaped with ``wait4`` through a pidfd (a forked one by the
fork server, which reports the same figures), so the run's CPU time and peak memory come
from the kernel's ``rusage`` of the worker and every descendant it waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from toolfleet.errors import SandboxFailure
from toolfleet.isolation.protocol import FrameDecoder, ProtocolError, encode
from toolfleet.isolation.sandbox import RPC_FD, SECCOMP_FD


@dataclass(frozen=True, slots=True, kw_only=True)
class Exit:
    """How a worker ended, from ``wait4``."""

    status: int
    cpu_s: float
    """User + system CPU seconds of the worker and its reaped descendants."""
    maxrss_kb: int

    @property
    def signal(self) -> int | None:
        """The signal that ended the tool (bwrap reports it as status 128 + signal)."""
        if os.WIFSIGNALED(self.status):
            return os.WTERMSIG(self.status)
        code = os.WEXITSTATUS(self.status)
        return code - 128 if 128 < code < 160 else None

    @property
    def code(self) -> int | None:
        return os.WEXITSTATUS(self.status) if os.WIFEXITED(self.status) else None


def worker_command(
    *, uid: int | None, workdir: str | None, preload: str = "", sys_path: Sequence[str] = ()
) -> list[str]:
    """The worker's command line; ``preload``: a tool's module, imported before ready
    from ``sys_path`` (the executor's import path)."""
    argv = [sys.executable, "-I", "-m", "toolfleet.isolation.child", "--fd", str(RPC_FD)]
    if uid is not None:
        argv += ["--uid", str(uid)]
    if workdir is not None:
        argv += ["--workdir", workdir]
    if preload:
        argv += ["--preload", preload, "--sys-path", os.pathsep.join(sys_path)]
    return argv


class Worker:
    """A started worker. :meth:`spawn` it, :meth:`ready`, :meth:`send`, :meth:`receive`."""

    def __init__(
        self,
        *,
        pid: int,
        rpc: socket.socket,
        output: socket.socket,
        slot: int,
        reported: asyncio.Future[Exit] | None = None,
    ) -> None:
        """``reported``: the exit as the process's parent reports it, for a worker that is
        not this process's child (a fork of the fork server); else it is reaped here."""
        self.pid = pid
        self.slot = slot
        self.ready_cpu_s = 0.0
        self._rpc = rpc
        self._output = output
        self._decoder = FrameDecoder()
        self._frames: list[dict[str, Any]] = []
        self.output_bytes = 0
        self.output_limit: int | None = None
        self.output_overflow = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[Exit] = loop.create_future()
        self._closed = False
        if reported is None:
            self._pidfd = os.pidfd_open(pid)
            loop.add_reader(self._pidfd, self._on_exit)
        else:
            self._pidfd = -1
            reported.add_done_callback(self._on_reported)
        self._drain = asyncio.create_task(self._drain_output())

    @classmethod
    async def spawn(
        cls, argv: Sequence[str], *, slot: int, seccomp_fd: int | None = None
    ) -> Worker:
        with worker_sockets() as sockets:
            actions: list[tuple[Any, ...]] = [
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, sockets.child_output.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, sockets.child_output.fileno(), 2),
                (os.POSIX_SPAWN_DUP2, sockets.child_rpc.fileno(), RPC_FD),
            ]
            if seccomp_fd is not None:
                actions.append((os.POSIX_SPAWN_DUP2, seccomp_fd, SECCOMP_FD))
            pid = spawn_in_session(argv, actions, what="the worker")
        return cls(pid=pid, rpc=sockets.rpc, output=sockets.output, slot=slot)

    async def ready(self, timeout_s: float) -> None:
        """Wait for the worker's ``ready`` frame."""
        try:
            async with asyncio.timeout(timeout_s):
                frame = await self.receive()
        except TimeoutError:
            raise SandboxFailure(f"the worker was not ready within {timeout_s:g}s") from None
        if frame is None or frame.get("kind") != "ready":
            raise SandboxFailure("the worker ended before it was ready")
        self.ready_cpu_s = float(frame.get("cpu_s", 0.0))

    async def send(self, message: dict[str, Any]) -> None:
        await asyncio.get_running_loop().sock_sendall(self._rpc, encode(message))

    async def receive(self) -> dict[str, Any] | None:
        """The next frame, or None once the worker closed its socket (ended)."""
        loop = asyncio.get_running_loop()
        while not self._frames:
            try:
                data = await loop.sock_recv(self._rpc, 1 << 20)
            except OSError:
                data = b""
            if not data:
                return None
            self._frames.extend(self._decoder.feed(data))
        return self._frames.pop(0)

    async def _drain_output(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                data = await loop.sock_recv(self._output, 1 << 20)
            except OSError:
                return
            if not data:
                return
            self.output_bytes += len(data)
            if self.output_limit is not None and self.output_bytes > self.output_limit:
                self.output_overflow.set()
                self.kill()
                return

    def _on_exit(self) -> None:
        try:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: its figures are gone, not its end
            pid, status, usage = self.pid, 0, None
        if pid == 0:
            return
        if not self._exited.done():
            self._exited.set_result(
                Exit(
                    status=status,
                    cpu_s=usage.ru_utime + usage.ru_stime if usage else 0.0,
                    maxrss_kb=int(usage.ru_maxrss) if usage else 0,
                )
            )
        asyncio.get_running_loop().remove_reader(self._pidfd)

    def _on_reported(self, reported: asyncio.Future[Exit]) -> None:
        if not self._exited.done():
            self._exited.set_result(reported.result())

    @property
    def exited(self) -> asyncio.Future[Exit]:
        return self._exited

    def snapshot(self) -> tuple[float, int]:
        """CPU seconds and peak memory (kB) of the worker's live descendants, from /proc.

        Taken before a kill: a PID namespace's init does not pass its children's
        ``rusage`` on, so a sandbox killed mid-run is measured here."""
        cpu, peak = 0.0, 0
        ticks = os.sysconf("SC_CLK_TCK")
        for pid in _descendants(self.pid):
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                cpu += sum(int(f) for f in fields[11:15]) / ticks
                with open(f"/proc/{pid}/status") as handle:
                    for line in handle:
                        if line.startswith("VmHWM:"):
                            peak = max(peak, int(line.split()[1]))
        return cpu, peak

    def signal_group(self, sig: int) -> None:
        """Signal the worker's whole process group (its session)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, sig)

    def kill(self) -> None:
        if not self._exited.done():
            self.signal_group(signal.SIGKILL)

    async def close(self) -> Exit:
        """Kill (if still running), reap and release everything; the worker's exit.

        Idempotent: a second call returns the same exit and closes nothing again (a
        closed fd number may already belong to someone else)."""
        self.kill()
        exit_ = await asyncio.shield(self._exited)
        if self._closed:
            return exit_
        self._closed = True
        self._drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._drain
        # An fd closed while the selector still watches it leaves a stale key behind: the
        # next socket given that number would never be read. Unregister first, always.
        loop = asyncio.get_running_loop()
        for fd in (self._rpc.fileno(), self._output.fileno(), self._pidfd):
            if fd >= 0:
                loop.remove_reader(fd)
                loop.remove_writer(fd)
        self._rpc.close()
        self._output.close()
        pidfd, self._pidfd = self._pidfd, -1
        if pidfd >= 0:
            with contextlib.suppress(OSError):
                os.close(pidfd)
        return exit_


@dataclass(frozen=True, slots=True)
class WorkerSockets:
    """The executor's ends (``rpc``, ``output``) and the worker's ends of its sockets."""

    rpc: socket.socket
    child_rpc: socket.socket
    output: socket.socket
    child_output: socket.socket


@contextlib.contextmanager
def worker_sockets() -> Iterator[WorkerSockets]:
    """A new worker's socket pairs. The worker's ends are closed when the block ends
    (handed over by then); the executor's ends too if it raised, else made non-blocking."""
    rpc, child_rpc = socket.socketpair()
    output, child_output = socket.socketpair()
    try:
        yield WorkerSockets(rpc, child_rpc, output, child_output)
    except BaseException:
        rpc.close()
        output.close()
        raise
    finally:
        child_rpc.close()
        child_output.close()
    rpc.setblocking(False)
    output.setblocking(False)


def spawn_in_session(argv: Sequence[str], actions: Sequence[tuple[Any, ...]], *, what: str) -> int:
    """``posix_spawn`` ``argv`` in a session of its own, with ``actions`` on its fds and
    only ``PATH`` and ``LANG`` in its environment; its pid."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    try:
        # posix_spawn returns as soon as the child exists (vfork): no await needed.
        return os.posix_spawn(argv[0], list(argv), env, file_actions=list(actions), setsid=True)
    except OSError as exc:
        raise SandboxFailure(f"{what} could not start ({exc.strerror})") from None


def _descendants(root: int) -> list[int]:
    found: list[int] = []
    queue = [root]
    while queue:
        pid = queue.pop()
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as handle:
                    children = [int(c) for c in handle.read().split()]
                found.extend(children)
                queue.extend(children)
    return found


__all__ = [
    "Exit",
    "ProtocolError",
    "Worker",
    "WorkerSockets",
    "spawn_in_session",
    "worker_command",
    "worker_sockets",
]
