"""Drives one job through a ready worker: send it, answer the worker's calls, forward a
cancel, enforce the wall clock, settle the worker, and decide the outcome.

What happened is reported to a :class:`~toolfleet.isolation.run_states.RunMachine`; how
the worker is settled and what the outcome is are read from its state
(:mod:`toolfleet.isolation.run_states`), not from flags.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Any, Protocol

from pydantic import ValidationError

from toolfleet.errors import SandboxFailure, ToolfleetError
from toolfleet.isolation.protocol import Done, ProtocolError, RunJob
from toolfleet.isolation.run_states import IsolatedResult, RunEvent, RunMachine, decide
from toolfleet.isolation.worker import Exit
from toolfleet.tools.context import ToolContext
from toolfleet.tools.limits import RunLimits

#: How often a run without a cancel yet looks at ``ctx.cancelled``.
CANCEL_POLL_S = 0.05


class RunWorker(Protocol):
    """What the driver uses of a :class:`~toolfleet.isolation.worker.Worker`."""

    output_limit: int | None
    output_overflow: asyncio.Event
    ready_cpu_s: float

    @property
    def exited(self) -> asyncio.Future[Exit]: ...

    async def send(self, message: dict[str, Any]) -> None: ...

    async def receive(self) -> dict[str, Any] | None: ...

    def snapshot(self) -> tuple[float, int]: ...

    def signal_group(self, sig: int) -> None: ...

    def kill(self) -> None: ...

    async def close(self) -> Exit: ...


async def drive(
    *, job: RunJob, limits: RunLimits, ctx: ToolContext, worker: RunWorker
) -> IsolatedResult:
    """Run ``job`` on ``worker`` with ``ctx``'s checkpoints, credentials and cancel.

    A cancel of this task (a cancel past its grace, a lost lease, shutdown) kills the
    worker at once and goes on; so does anything serving raised, after the kill grace.
    """
    worker.output_limit = limits.max_output_bytes
    run = RunMachine()
    try:
        await _serve_until_end(run, worker, ctx, job, limits.timeout_s)
    except BaseException as exc:
        run.fire(RunEvent.ABORTED)
        if isinstance(exc, asyncio.CancelledError):
            worker.kill()
        await _settle(run, worker, limits.kill_grace_s)
        raise
    await _settle(run, worker, limits.kill_grace_s)
    exit_ = None
    if not run.state.keeps_worker or worker.output_overflow.is_set():
        exit_ = await worker.close()
    if worker.output_overflow.is_set():
        run.fire(RunEvent.OVERFLOWED)
    end = run.end(exit_, baseline_cpu_s=worker.ready_cpu_s)
    return decide(end, tool_id=job.tool_id, limits=limits)


async def _serve_until_end(
    run: RunMachine, worker: RunWorker, ctx: ToolContext, job: RunJob, timeout_s: float
) -> None:
    try:
        await worker.send(job.model_dump(mode="json"))
    except OSError:
        run.fire(RunEvent.HUNG_UP)
        return
    run.fire(RunEvent.SENT)
    try:
        async with asyncio.timeout(timeout_s) as deadline:
            done = await serve(worker, ctx)
    except TimeoutError:
        if not deadline.expired():
            raise  # another timeout, inside a call's answer: not the run's
        run.fire(RunEvent.EXPIRED)
    except OSError:
        run.fire(RunEvent.HUNG_UP)  # it closed its socket: judged by its exit
    else:
        run.answer(done)


async def _settle(run: RunMachine, worker: RunWorker, grace_s: float) -> None:
    """Leave the worker as the run's state says: alone (it answered), or killed after
    the grace it gets, measured from /proc while it still runs."""
    state = run.state
    if state.keeps_worker:
        return  # it answered and exits by itself: reaped after the call returns
    if state.terminated:
        run.saw(worker.snapshot())
        worker.signal_group(signal.SIGTERM)
    if state.lingers:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await asyncio.shield(worker.exited)
    if not worker.exited.done():
        run.saw(worker.snapshot())
    worker.kill()


async def serve(worker: RunWorker, ctx: ToolContext) -> Done | None:
    """Answer the worker's calls until it is done (None: it hung up); forward a cancel.

    A call whose answer raises something other than a tool error (``StaleLease``,
    ``Suspended``: the run is discarded or handed over) ends the run with it, as
    it would in-process.
    """
    cancel_sent = False
    calls: set[asyncio.Task[None]] = set()
    receive: asyncio.Future[dict[str, Any] | None] | None = None
    try:
        while True:
            if receive is None:
                receive = asyncio.ensure_future(worker.receive())
            if not cancel_sent and ctx.cancelled:
                await worker.send({"kind": "cancel"})
                cancel_sent = True
            waiting: set[asyncio.Future[Any]] = {receive, *calls}
            await asyncio.wait(
                waiting,
                timeout=None if cancel_sent else CANCEL_POLL_S,
                return_when=asyncio.FIRST_COMPLETED,
            )
            for task in [t for t in calls if t.done()]:
                calls.discard(task)
                task.result()
            if not receive.done():
                continue
            frame, receive = receive.result(), None
            if frame is None:
                return None
            if frame.get("kind") == "done":
                return _done(frame)
            if frame.get("kind") == "call":
                calls.add(asyncio.create_task(answer(worker, ctx, frame)))
    finally:
        if receive is not None and not receive.done():
            receive.cancel()
        for task in calls:
            task.cancel()


def _done(frame: dict[str, Any]) -> Done:
    try:
        return Done.model_validate(frame)
    except ValidationError:
        raise ProtocolError("the worker's done frame is not an answer") from None


async def answer(worker: RunWorker, ctx: ToolContext, frame: dict[str, Any]) -> None:
    """Answer one call of the worker with the executor's own context."""
    args = frame.get("args") or {}
    reply: dict[str, Any] = {"kind": "reply", "id": frame.get("id")}
    try:
        reply["value"] = await _call(ctx, frame.get("method"), args)
    except ToolfleetError as exc:
        reply["error"] = exc.to_error_info().model_dump(mode="json")
    await worker.send(reply)


async def _call(ctx: ToolContext, method: object, args: dict[str, Any]) -> Any:
    match method:
        case "checkpoint":
            return await ctx.checkpoint(
                dict(args.get("state") or {}),
                float(args.get("progress_percent", 0.0)),
                str(args.get("current_phase", "")),
                name=args.get("name"),
            )
        case "credential":
            return ctx.credential(str(args.get("name", ""))).reveal()
        case "documents.get":
            document = await ctx.documents.get(str(args.get("document_id", "")))
            return document.model_dump(mode="json")
        case "documents.metadata":
            meta = await ctx.documents.metadata(str(args.get("document_id", "")))
            return meta.model_dump(mode="json")
        case "documents.search":
            hits = await ctx.documents.search(str(args.get("query", "")), limit=_limit(args))
            return [hit.model_dump(mode="json") for hit in hits]
        case "documents.overlaps":
            hits = await ctx.documents.overlaps(
                str(args.get("document_id", "")), limit=_limit(args)
            )
            return [hit.model_dump(mode="json") for hit in hits]
        case _:
            raise SandboxFailure("unknown call from the worker")


def _limit(args: dict[str, Any]) -> int:
    """A search's ``limit`` from the worker, kept to what a source is asked for anyway."""
    try:
        return max(1, min(int(args.get("limit", 10)), 100))
    except (TypeError, ValueError):
        return 10


__all__ = ["CANCEL_POLL_S", "RunWorker", "answer", "drive", "serve"]
