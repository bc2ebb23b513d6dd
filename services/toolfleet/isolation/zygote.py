"""The fork server of ``process`` workers: ``python -I -m toolfleet.isolation.zygote``.

A fresh interpreter that imports the SDK costs about 0.2 s of CPU, which made a
process-isolated call spawn-bound (about 9 calls per second on two cores). The fork
server is that interpreter, started once per executor with the child runtime and the SDK
imported; each worker is a fork of it: still a fresh process per call (one job, then
exit; nothing of an earlier call is in it), in a session of its own, its stdout and
stderr and its RPC socket handed over by the executor (``SCM_RIGHTS``), its limits set
by the job as before (:mod:`toolfleet.isolation.child`).

A tool's module is imported in the server too, the first time a worker is forked for a
call of that tool or kept warm for it (``import``): the workers forked
afterwards, for every call of it, start with the module imported rather than paying
the import per call. Module-level state made at import (a thread, a connection) is
then the server's, and a forked worker gets a copy without the thread: such a tool
should make it in the call, or run with ``TOOLFLEET_ISOLATION_FORK_SERVER=false``.

The server is the workers' parent, so it reaps them and reports each exit (status,
CPU, peak RSS from ``wait4``) to the executor, which holds them as
:class:`~toolfleet.isolation.worker.Worker` objects like spawned ones. Sandboxes are
never forked from it (they start through ``bwrap``). The server dies with the executor
(``PR_SET_PDEATHSIG``) and ends when its socket closes.

Messages, one per ``SOCK_SEQPACKET`` datagram, JSON: ``{"preload", "sys_path", "import"}`` with
two fds (RPC, output) from the executor; ``{"ready": true}``, ``{"forked": pid}`` or
``{"failed": reason}``, and ``{"exited": pid, "status", "cpu_s", "maxrss_kb"}`` from
the server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import importlib
import json
import os
import selectors
import signal
import socket
import sys
from typing import Any

from toolfleet.errors import SandboxFailure
from toolfleet.isolation.sandbox import RPC_FD
from toolfleet.isolation.worker import Exit, Worker, spawn_in_session, worker_sockets

_PR_SET_PDEATHSIG = 1
_MAX_MESSAGE = 1 << 16


# --- the executor's side ------------------------------------------------------------


class ForkServer:
    """The executor's handle on its fork server: :meth:`start`, :meth:`fork`, :meth:`close`."""

    def __init__(self, *, start_timeout_s: float = 30.0) -> None:
        self._start_timeout_s = start_timeout_s
        self._sock: socket.socket | None = None
        self._pid = 0
        self._lock = asyncio.Lock()
        self._replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._exits: dict[int, asyncio.Future[Exit]] = {}

    @property
    def running(self) -> bool:
        return self._sock is not None

    @property
    def pid(self) -> int:
        return self._pid

    async def start(self) -> None:
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [sys.executable, "-I", "-m", "toolfleet.isolation.zygote", "--fd", str(RPC_FD)]
        actions: list[tuple[Any, ...]] = [
            (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
            (os.POSIX_SPAWN_OPEN, 2, "/dev/null", os.O_WRONLY, 0),
            (os.POSIX_SPAWN_DUP2, child.fileno(), RPC_FD),
        ]
        try:
            self._pid = spawn_in_session(argv, actions, what="the fork server")
        except SandboxFailure:
            parent.close()
            raise
        finally:
            child.close()
        parent.setblocking(False)
        self._sock = parent
        asyncio.get_running_loop().add_reader(parent.fileno(), self._on_message)
        try:
            async with asyncio.timeout(self._start_timeout_s):
                ready = await self._replies.get()
        except TimeoutError:
            await self.close()
            raise SandboxFailure("the fork server was not ready in time") from None
        if not ready.get("ready"):
            await self.close()
            raise SandboxFailure("the fork server ended before it was ready")

    async def fork(
        self, *, slot: int, preload: str = "", sys_path: str = "", server_import: str = ""
    ) -> Worker:
        """A new worker forked from the server (its ``ready`` still to come). The server
        imports ``server_import`` first, once per module."""
        with worker_sockets() as sockets:
            async with self._lock:  # one fork at a time: replies come in order
                sock = self._sock
                if sock is None:
                    raise SandboxFailure("the fork server is not running")
                request = json.dumps(
                    {"preload": preload, "sys_path": sys_path, "import": server_import}
                ).encode()
                handed = [sockets.child_rpc.fileno(), sockets.child_output.fileno()]
                try:
                    socket.send_fds(sock, [request], handed)
                except OSError as exc:  # full (it stopped reading) or gone
                    await self.close()
                    raise SandboxFailure(f"the fork server did not take a fork ({exc})") from None
                try:
                    async with asyncio.timeout(self._start_timeout_s):
                        reply = await self._replies.get()
                except TimeoutError:
                    await self.close()  # stuck: the next worker gets a new server
                    raise SandboxFailure("the fork server did not answer a fork") from None
            pid = reply.get("forked")
            if not isinstance(pid, int):
                raise SandboxFailure(f"the fork server could not fork ({reply.get('failed')})")
        reported = self._exits.get(pid)
        if reported is None:
            reported = self._exits[pid] = asyncio.get_running_loop().create_future()
        elif reported.done():
            del self._exits[pid]  # it exited before this reply was read
        return Worker(pid=pid, rpc=sockets.rpc, output=sockets.output, slot=slot, reported=reported)

    def _on_message(self) -> None:
        sock = self._sock
        if sock is None:
            return
        while True:
            try:
                data = sock.recv(_MAX_MESSAGE)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._gone()
                return
            message = json.loads(data)
            pid = message.get("exited")
            if isinstance(pid, int):
                reported = self._exits.pop(pid, None)
                if reported is None:
                    reported = asyncio.get_running_loop().create_future()
                    self._exits[pid] = reported  # exited before its fork reply was read
                if not reported.done():
                    reported.set_result(
                        Exit(
                            status=int(message["status"]),
                            cpu_s=float(message["cpu_s"]),
                            maxrss_kb=int(message["maxrss_kb"]),
                        )
                    )
            else:
                self._replies.put_nowait(message)

    def _gone(self) -> None:
        """The server ended: its workers die with it (``PR_SET_PDEATHSIG``, and killed
        here too), as killed workers whose figures are lost; no more forks from it."""
        sock, self._sock = self._sock, None
        if sock is not None:
            asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()
        exits, self._exits = self._exits, {}
        for pid, reported in exits.items():
            if not reported.done():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
                reported.set_result(Exit(status=signal.SIGKILL, cpu_s=0.0, maxrss_kb=0))
        self._replies.put_nowait({"failed": "the fork server ended"})

    async def close(self) -> None:
        """Stop the server; a worker of it still running dies with it."""
        pid, self._pid = self._pid, 0
        if self._sock is not None:
            self._gone()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            await asyncio.to_thread(_reap, pid)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


# --- the server ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toolfleet.isolation.zygote")
    parser.add_argument("--fd", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent()  # the executor
    # What every worker would import for itself: done once here.
    import toolfleet.isolation.child
    import toolfleet.isolation.remote
    import toolfleet.tools.context
    import toolfleet.tools.spec  # noqa: F401

    control = socket.socket(fileno=args.fd)
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the selector through the pipe
    control.send(json.dumps({"ready": True}).encode())
    with selectors.DefaultSelector() as selector:
        selector.register(control, selectors.EVENT_READ)
        selector.register(wake_read, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj is control:
                    try:
                        message, fds, _, _ = socket.recv_fds(control, _MAX_MESSAGE, 2)
                    except InterruptedError:
                        continue
                    if not message:
                        return 0  # the executor closed its end
                    _fork(control, selector, (wake_read, wake_write), json.loads(message), fds)
                else:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_read, 4096):
                            pass
                    _report_exits(control)


def _fork(
    control: socket.socket,
    selector: selectors.BaseSelector,
    wake: tuple[int, int],
    request: dict[str, Any],
    fds: list[int],
) -> None:
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        control.send(json.dumps({"failed": "a fork takes two fds"}).encode())
        return
    rpc, output = fds
    module = str(request.get("import") or "")
    if module:
        _import_once(module, str(request.get("sys_path", "")))
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(rpc)
        os.close(output)
        control.send(json.dumps({"failed": exc.strerror or "fork failed"}).encode())
        return
    if pid == 0:  # the worker
        code = 70
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            selector.close()
            for fd in wake:
                os.close(fd)
            control.close()  # frees RPC_FD for the worker's own socket
            os.setsid()
            _die_with_parent()  # the server: nobody would reap or report it after
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            os.dup2(output, 1)
            os.dup2(output, 2)
            os.dup2(rpc, RPC_FD)
            os.close(output)
            os.close(rpc)
            from toolfleet.isolation.child import serve

            code = serve(
                RPC_FD,
                preload=str(request.get("preload", "")),
                sys_path=str(request.get("sys_path", "")),
            )
        finally:
            os._exit(code)
    os.close(rpc)
    os.close(output)
    control.send(json.dumps({"forked": pid}).encode())


_TRIED: set[str] = set()


def _import_once(module: str, sys_path: str) -> None:
    """Import a tool's module here, once (the first worker forked for it asks): every
    worker forked afterwards, for any call of that tool, finds it imported. The executor
    imported the module too, to register the tool, so no code runs here that did not run
    there. A module that fails to import is left to the worker, which reports it."""
    if module in _TRIED:
        return
    _TRIED.add(module)
    paths = [p for p in sys_path.split(os.pathsep) if p]
    if paths:
        sys.path[:] = paths
    with contextlib.suppress(Exception, SystemExit):
        importlib.import_module(module)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _report_exits(control: socket.socket) -> None:
    while True:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        control.send(
            json.dumps(
                {
                    "exited": pid,
                    "status": status,
                    "cpu_s": usage.ru_utime + usage.ru_stime,
                    "maxrss_kb": usage.ru_maxrss,
                }
            ).encode()
        )


if __name__ == "__main__":
    sys.exit(main())
