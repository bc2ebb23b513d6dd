"""The isolated worker: ``python -I -m toolfleet.isolation.child --fd 3 [--uid U]``.

Until it loads the tool this is trusted code: it drops to its own uid (``--uid``, when
started as root), sets no-new-privileges, imports the SDK (so a warm worker answers in
milliseconds), (and, for a warm worker kept for one tool, that tool's module: ``--preload``), says
``ready`` and waits for one job. Then it applies the job's limits
with ``setrlimit`` (they only go down, and the hard limit with them), and runs the tool
once: a Python tool (``module:qualname``) in its own event loop, or a command tool
(:mod:`toolfleet.isolation.command`). ``ctx.checkpoint()``, ``ctx.credential()`` and
``ctx.cancelled`` travel over the RPC socket (:mod:`toolfleet.isolation.protocol`).
One job per worker: a sandbox never serves a second call.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import ctypes
import importlib
import itertools
import math
import os
import resource
import sys
import threading
from typing import Any

from toolfleet.isolation.protocol import (
    Done,
    JobLimits,
    ReportedUsage,
    RunJob,
    read_frame,
    write_frame,
)

_PR_SET_NO_NEW_PRIVS = 38


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="toolfleet.isolation.child")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--uid", type=int, default=None)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--preload", default="")
    parser.add_argument("--sys-path", default="")
    args = parser.parse_args(argv)
    return serve(
        args.fd, uid=args.uid, workdir=args.workdir, preload=args.preload, sys_path=args.sys_path
    )


def serve(
    fd: int, *, uid: int | None = None, workdir: str | None = None, preload: str, sys_path: str
) -> int:
    """Be the worker on RPC socket ``fd``: ready, one job, exit. A started interpreter
    calls it from :func:`main`; the fork server (:mod:`toolfleet.isolation.zygote`) in
    each process it forks."""
    os.set_inheritable(fd, False)  # commands the tool starts never see the RPC socket
    if uid is not None and os.geteuid() == 0:
        _drop_privileges(uid, workdir)
    _no_new_privs()
    # Preloaded (the part of a start a warm worker saves): what ``toolfleet.sdk`` gives
    # a tool module.
    import toolfleet.tools.spec  # noqa: F401

    if preload:
        # A warm worker kept for one tool: its module imported now, as its own uid, in
        # its sandbox, before the call's limits (a failed import only costs the warmth).
        sys.path[:] = [p for p in sys_path.split(os.pathsep) if p] or sys.path
        with contextlib.suppress(Exception):
            importlib.import_module(preload)

    write_frame(fd, {"kind": "ready", "cpu_s": _cpu_seconds()})
    job = _job(read_frame(fd))
    if job is None:
        return 0
    channel = Channel(fd)
    outcome = _run_job(job, channel)
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    usage = ReportedUsage(
        cpu_s=own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime,
        maxrss_kb=max(own.ru_maxrss, children.ru_maxrss),
    )
    channel.send(outcome.model_copy(update={"usage": usage}).frame())
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: the tool's threads or atexit hooks do not run


def _job(frame: dict[str, Any] | None) -> RunJob | None:
    """The job in ``frame``; None for anything else (the worker then ends unanswered)."""
    if frame is None or frame.get("kind") != "run":
        return None
    try:
        return RunJob.model_validate(frame)
    except ValueError:  # pydantic's ValidationError included
        return None


def _drop_privileges(uid: int, workdir: str | None) -> None:
    for path in (workdir,):
        if path and os.path.isdir(path):
            os.chown(path, uid, uid)
            os.chmod(path, 0o700)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _no_new_privs() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def apply_limits(limits: JobLimits) -> None:
    """``setrlimit`` soft = hard (a tool cannot raise them back), CPU counted from now."""
    mib = 1024 * 1024
    cpu = math.ceil(_cpu_seconds()) + limits.cpu_seconds
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL
    for name, value in (
        (resource.RLIMIT_AS, limits.memory_mb * mib),
        (resource.RLIMIT_NPROC, limits.max_processes),
        (resource.RLIMIT_FSIZE, limits.max_file_mb * mib),
        (resource.RLIMIT_NOFILE, limits.max_open_files),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(name, (value, value))


class Channel:
    """The worker's side of the RPC: calls the executor answers, and its cancel."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, concurrent.futures.Future[Any]] = {}
        self.cancelled = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cancel_event: asyncio.Event | None = None
        threading.Thread(target=self._read, name="toolfleet-rpc", daemon=True).start()

    def bind(self, loop: asyncio.AbstractEventLoop, cancel_event: asyncio.Event) -> None:
        self._loop, self._cancel_event = loop, cancel_event
        if self.cancelled.is_set():
            cancel_event.set()

    def send(self, message: dict[str, Any]) -> None:
        with self._lock:
            write_frame(self._fd, message)

    def call(self, method: str, args: dict[str, Any]) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        call_id = next(self._ids)
        self._pending[call_id] = future
        self.send({"kind": "call", "id": call_id, "method": method, "args": args})
        return future

    def _read(self) -> None:
        while True:
            try:
                frame = read_frame(self._fd)
            except Exception:
                frame = None
            if frame is None:
                os._exit(0)  # the executor is gone: so is this run
            if frame.get("kind") == "cancel":
                self.cancelled.set()
                if self._loop is not None and self._cancel_event is not None:
                    self._loop.call_soon_threadsafe(self._cancel_event.set)
            elif frame.get("kind") == "reply":
                future = self._pending.pop(int(frame.get("id", 0)), None)
                if future is not None:
                    if "error" in frame:
                        future.set_exception(_error(frame["error"]))
                    else:
                        future.set_result(frame.get("value"))


def _error(info: dict[str, Any]) -> Exception:
    from toolfleet.errors import ErrorInfo, error_from

    return error_from(ErrorInfo.model_validate(info))


def _run_job(job: RunJob, channel: Channel) -> Done:
    from toolfleet.errors import ResourceExhausted, ToolExecutionError, ToolfleetError

    try:
        apply_limits(job.limits)
        os.environ.clear()
        os.environ.update(job.env)
        sys.path[:] = [p for p in job.sys_path if p]
        result = asyncio.run(_run_tool(job, channel))
    except ToolfleetError as exc:
        return Done(error=exc.to_error_info())
    except MemoryError:
        return Done(
            error=ResourceExhausted(
                f"{job.tool_id} ran out of memory ({job.limits.memory_mb} MB)"
            ).to_error_info()
        )
    except BaseException as exc:
        return Done(
            error=ToolExecutionError(f"{job.tool_id} failed: {type(exc).__name__}").to_error_info()
        )
    # Not validated: the tool's own dict goes out as it returned it (json.dumps judges).
    return Done.model_construct(result=result)


async def _run_tool(job: RunJob, channel: Channel) -> dict[str, Any]:
    from pydantic import BaseModel

    from toolfleet.isolation.remote import remote_context

    cancel_event = asyncio.Event()
    channel.bind(asyncio.get_running_loop(), cancel_event)
    ctx = remote_context(job, channel, cancel_event)
    bridge = None
    if job.egress_socket:
        from toolfleet.isolation.bridge import start_bridge

        bridge = await start_bridge(job.egress_socket)
    try:
        if job.command:
            from toolfleet.isolation.command import run_command

            return await run_command(job, ctx)
        from toolfleet.tools.spec import spec_of

        module_name, _, qualname = job.target.partition(":")
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
        spec = spec_of(target)
        params = spec.input_model.model_validate(job.parameters)
        output = await spec.fn(params, ctx)
    finally:
        if bridge is not None:
            bridge.close()
    if isinstance(output, BaseModel):
        return output.model_dump(mode="json")
    if isinstance(output, dict):
        return output
    return {"value": output}


if __name__ == "__main__":
    sys.exit(main())
