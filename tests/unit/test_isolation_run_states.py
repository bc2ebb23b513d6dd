"""One isolated run's states and outcomes, on a worker twin: no process, no sleep.

The wall clock and the kill grace are zero-length deadlines (they expire at the loop's
next turn); the worker twin dies when it is signalled, as a real one does. The real
processes are driven in ``tests/integration/test_isolation.py``.
"""

from __future__ import annotations

import asyncio
import signal
from dataclasses import replace
from typing import Any

import pytest

from toolfleet.errors import ErrorCode, ErrorInfo
from toolfleet.isolation.drive import drive
from toolfleet.isolation.protocol import Done, JobLimits, ProtocolError, ReportedUsage, RunJob
from toolfleet.isolation.run_states import (
    TRANSITIONS,
    InvalidTransition,
    RunEnd,
    RunEvent,
    RunMachine,
    RunState,
    decide,
    step,
)
from toolfleet.isolation.worker import Exit
from toolfleet.tools.context import CheckpointInput, ToolContext
from toolfleet.tools.limits import RunLimits

pytestmark = pytest.mark.unit

LIMITS = RunLimits(
    timeout_s=30.0,
    kill_grace_s=0.0,
    cpu_seconds=10,
    memory_mb=256,
    max_processes=16,
    max_file_mb=8,
    max_open_files=64,
    max_output_bytes=1000,
)


def killed_by(sig: int, *, cpu_s: float = 0.5, maxrss_kb: int = 2048) -> Exit:
    return Exit(status=int(sig), cpu_s=cpu_s, maxrss_kb=maxrss_kb)


def exited_with(code: int, *, cpu_s: float = 0.5) -> Exit:
    return Exit(status=code << 8, cpu_s=cpu_s, maxrss_kb=2048)


class WorkerTwin:
    """A worker that answers from a script and dies when signalled (or by itself)."""

    def __init__(
        self,
        *,
        frames: list[dict[str, Any] | None] | None = None,
        send_fails: bool = False,
        dies_on: tuple[int, ...] = (signal.SIGTERM, signal.SIGKILL),
        cpu_s: float = 0.5,
        snapshot: tuple[float, int] = (0.0, 0),
    ) -> None:
        self.output_limit: int | None = None
        self.output_overflow = asyncio.Event()
        self.ready_cpu_s = 0.0
        self.sent: list[dict[str, Any]] = []
        self.signals: list[int] = []
        self.closes = 0
        self.replied = asyncio.Event()
        self.waiting = asyncio.Event()
        """Set when the driver waits for a frame the script does not have."""
        self._frames: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        for frame in frames or []:
            self._frames.put_nowait(frame)
        self._send_fails = send_fails
        self._dies_on = dies_on
        self._cpu_s = cpu_s
        self._snapshot = snapshot
        self._exited: asyncio.Future[Exit] = asyncio.get_running_loop().create_future()

    @property
    def exited(self) -> asyncio.Future[Exit]:
        return self._exited

    def die(self, exit_: Exit) -> None:
        if not self._exited.done():
            self._exited.set_result(exit_)

    def push(self, frame: dict[str, Any] | None) -> None:
        self._frames.put_nowait(frame)

    async def send(self, message: dict[str, Any]) -> None:
        if self._send_fails:
            raise BrokenPipeError
        self.sent.append(message)
        if message.get("kind") == "reply":
            self.replied.set()

    async def receive(self) -> dict[str, Any] | None:
        if self._frames.empty():
            self.waiting.set()
        return await self._frames.get()

    def snapshot(self) -> tuple[float, int]:
        return self._snapshot

    def signal_group(self, sig: int) -> None:
        self.signals.append(sig)
        if sig in self._dies_on:
            self.die(killed_by(sig, cpu_s=self._cpu_s))

    def kill(self) -> None:
        if not self._exited.done():
            self.signal_group(signal.SIGKILL)

    async def close(self) -> Exit:
        self.kill()
        self.closes += 1
        return await asyncio.shield(self._exited)


class Checkpoints:
    def __init__(self) -> None:
        self.saved: list[CheckpointInput] = []

    async def save(self, checkpoint: CheckpointInput) -> str:
        self.saved.append(checkpoint)
        return f"cp-{len(self.saved)}"


def context(
    *, cancel: asyncio.Event | None = None, checkpoints: Checkpoints | None = None
) -> ToolContext:
    return ToolContext(
        tenant_id="t1",
        agent_did="did:web:agent",
        invocation_id="inv-1",
        tool_id="demo__echo",
        tool_version="1.0.0",
        cancel_event=cancel,
        checkpoints=checkpoints,
    )


JOB = RunJob(
    tool_id="demo__echo",
    target="tests.support.sample_tools:echo",
    parameters={"text": "hi"},
    limits=JobLimits(
        cpu_seconds=10,
        memory_mb=256,
        max_processes=16,
        max_file_mb=8,
        max_open_files=64,
        max_output_bytes=1000,
    ),
    sys_path=["/opt/app"],
    tenant_id="t1",
    agent_did="did:web:agent",
    invocation_id="inv-1",
    tool_version="1.0.0",
)


def done(**fields: Any) -> dict[str, Any]:
    return {"kind": "done", **fields}


# --- the table ------------------------------------------------------------------------


def test_a_run_that_answers_goes_starting_serving_answered() -> None:
    run = RunMachine()
    assert run.fire(RunEvent.SENT) is RunState.SERVING
    assert run.answer(Done(result={"ok": True}, usage=ReportedUsage())) is RunState.ANSWERED


def test_an_answer_without_usage_is_unmeasured_and_none_is_a_hang_up() -> None:
    unmeasured, hung_up = RunMachine(state=RunState.SERVING), RunMachine(state=RunState.SERVING)
    assert unmeasured.answer(Done(result={})) is RunState.UNMEASURED
    assert hung_up.answer(None) is RunState.HUNG_UP


@pytest.mark.parametrize(
    ("state", "after"),
    [
        (RunState.ANSWERED, RunState.OVERFLOWED),
        (RunState.UNMEASURED, RunState.OVERFLOWED),
        (RunState.HUNG_UP, RunState.OVERFLOWED),
        (RunState.TIMED_OUT, RunState.TIMED_OUT),
    ],
)
def test_overflowing_output_ends_every_run_but_a_timed_out_one(
    state: RunState, after: RunState
) -> None:
    assert step(state, RunEvent.OVERFLOWED) is after


def test_only_starting_or_serving_runs_can_be_aborted() -> None:
    aborts = {state for (state, event) in TRANSITIONS if event is RunEvent.ABORTED}
    assert aborts == {RunState.STARTING, RunState.SERVING}


@pytest.mark.parametrize(
    ("state", "event"),
    [
        (RunState.STARTING, RunEvent.ANSWERED),  # no answer before the job is sent
        (RunState.STARTING, RunEvent.EXPIRED),  # the clock starts once it is sent
        (RunState.ANSWERED, RunEvent.EXPIRED),
        (RunState.TIMED_OUT, RunEvent.ANSWERED),
        (RunState.ABORTED, RunEvent.OVERFLOWED),
        (RunState.OVERFLOWED, RunEvent.OVERFLOWED),
    ],
)
def test_an_event_the_state_does_not_accept_is_refused(state: RunState, event: RunEvent) -> None:
    with pytest.raises(InvalidTransition):
        step(state, event)


def test_only_the_answered_worker_is_left_alone_and_only_the_timed_out_one_gets_sigterm() -> None:
    assert [s for s in RunState if s.keeps_worker] == [RunState.ANSWERED]
    assert [s for s in RunState if s.terminated] == [RunState.TIMED_OUT]
    assert not RunState.UNMEASURED.lingers  # it answered: killed without a grace


# --- the decision ---------------------------------------------------------------------


def test_an_answered_run_keeps_its_answer_and_the_usage_it_reported() -> None:
    end = RunEnd(
        state=RunState.ANSWERED,
        done=Done(result={"v": 1}, usage=ReportedUsage(cpu_s=1.25, maxrss_kb=40960)),
        baseline_cpu_s=0.25,
    )
    outcome = decide(end, tool_id="demo__echo", limits=LIMITS)
    assert outcome.result == {"v": 1}
    assert outcome.error is None
    assert (outcome.usage.cpu_millicore_seconds, outcome.usage.memory_peak_mb) == (1000, 40)


def test_a_reaped_run_is_measured_by_the_most_of_kernel_snapshot_and_report() -> None:
    info = ErrorInfo(code=ErrorCode.TOOL_EXECUTION_ERROR, message="boom")
    end = RunEnd(
        state=RunState.UNMEASURED,
        done=Done(error=info),
        exit=killed_by(signal.SIGKILL, cpu_s=0.5, maxrss_kb=1024),
        seen=(2.0, 8192),
    )
    outcome = decide(end, tool_id="demo__echo", limits=LIMITS)
    assert outcome.error == info
    assert (outcome.usage.cpu_millicore_seconds, outcome.usage.memory_peak_mb) == (2000, 8)


@pytest.mark.parametrize(
    ("end", "code", "words"),
    [
        (RunEnd(state=RunState.TIMED_OUT, exit=killed_by(signal.SIGTERM)), "timeout", "30s"),
        (
            RunEnd(state=RunState.OVERFLOWED, exit=killed_by(signal.SIGKILL)),
            "resource_exhausted",
            "1000 bytes",
        ),
        (RunEnd(state=RunState.HUNG_UP, exit=killed_by(signal.SIGXCPU)), "timeout", "CPU"),
        (
            RunEnd(state=RunState.HUNG_UP, exit=killed_by(signal.SIGKILL, cpu_s=10.0)),
            "timeout",
            "10s of CPU",
        ),
        (
            RunEnd(state=RunState.HUNG_UP, exit=killed_by(signal.SIGKILL, cpu_s=1.0)),
            "sandbox_failure",
            "SIGKILL",
        ),
        (
            RunEnd(state=RunState.HUNG_UP, exit=killed_by(signal.SIGSEGV)),
            "sandbox_failure",
            "SIGSEGV",
        ),
        (RunEnd(state=RunState.HUNG_UP, exit=exited_with(3)), "sandbox_failure", "status 3"),
    ],
)
def test_a_run_without_an_answer_fails_with_the_contracts_code(
    end: RunEnd, code: str, words: str
) -> None:
    outcome = decide(end, tool_id="demo__echo", limits=LIMITS)
    assert outcome.error is not None
    assert outcome.result is None
    assert (outcome.error.code, words in outcome.error.message) == (code, True)


@pytest.mark.parametrize("state", [RunState.STARTING, RunState.SERVING, RunState.ABORTED])
def test_a_run_that_has_not_ended_has_no_outcome(state: RunState) -> None:
    with pytest.raises(InvalidTransition):
        decide(RunEnd(state=state), tool_id="demo__echo", limits=LIMITS)


def test_a_done_frame_holds_exactly_one_of_result_and_error() -> None:
    with pytest.raises(ValueError, match="result or an error"):
        Done.model_validate(done(usage={}))
    frame = Done(result={"a": 1}, usage=ReportedUsage(cpu_s=0.5, maxrss_kb=7)).frame()
    assert frame == {"kind": "done", "usage": {"cpu_s": 0.5, "maxrss_kb": 7}, "result": {"a": 1}}


# --- the driver on a twin -------------------------------------------------------------


async def test_the_worker_gets_the_typed_job_and_an_answered_run_is_left_to_exit() -> None:
    worker = WorkerTwin(frames=[done(usage={"cpu_s": 0.5}, result={"echo": "hi"})])
    outcome = await drive(job=JOB, limits=LIMITS, ctx=context(), worker=worker)
    assert outcome.result == {"echo": "hi"}
    assert RunJob.model_validate(worker.sent[0]) == JOB
    assert worker.sent[0]["kind"] == "run"
    assert worker.output_limit == 1000
    assert (worker.signals, worker.closes) == ([], 0)


async def test_an_answered_run_that_overflowed_its_output_is_resource_exhausted() -> None:
    worker = WorkerTwin(frames=[done(usage={}, result={})])
    worker.output_overflow.set()
    outcome = await drive(job=JOB, limits=LIMITS, ctx=context(), worker=worker)
    assert outcome.error is not None
    assert outcome.error.code == "resource_exhausted"
    assert worker.closes == 1


async def test_a_worker_that_dies_without_an_answer_is_a_sandbox_failure_naming_the_signal() -> (
    None
):
    worker = WorkerTwin(frames=[None])
    worker.die(killed_by(signal.SIGSEGV))
    outcome = await drive(job=JOB, limits=LIMITS, ctx=context(), worker=worker)
    assert outcome.error is not None
    assert outcome.error.code == "sandbox_failure"
    assert "SIGSEGV" in outcome.error.message
    assert worker.signals == []  # it was dead already: nothing to kill


async def test_a_worker_that_hangs_up_but_lives_on_is_killed_after_the_grace() -> None:
    worker = WorkerTwin(frames=[None])
    outcome = await drive(job=JOB, limits=LIMITS, ctx=context(), worker=worker)
    assert worker.signals == [signal.SIGKILL]
    assert outcome.error is not None
    assert outcome.error.code == "sandbox_failure"


async def test_a_job_that_cannot_be_sent_is_judged_by_the_workers_exit() -> None:
    worker = WorkerTwin(send_fails=True)
    worker.die(exited_with(1))
    outcome = await drive(job=JOB, limits=LIMITS, ctx=context(), worker=worker)
    assert outcome.error is not None
    assert "status 1" in outcome.error.message


async def test_the_wall_clock_sends_sigterm_and_measures_before_the_kill() -> None:
    worker = WorkerTwin(snapshot=(3.0, 4096), cpu_s=0.1)
    limits = replace(LIMITS, timeout_s=0.0)
    outcome = await drive(job=JOB, limits=limits, ctx=context(), worker=worker)
    assert outcome.error is not None
    assert outcome.error.code == "timeout"
    assert worker.signals == [signal.SIGTERM]  # it died of it: no SIGKILL needed
    assert outcome.usage.cpu_millicore_seconds == 3000  # the snapshot, not the reap


async def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    worker = WorkerTwin(dies_on=(signal.SIGKILL,))
    limits = replace(LIMITS, timeout_s=0.0)
    outcome = await drive(job=JOB, limits=limits, ctx=context(), worker=worker)
    assert worker.signals == [signal.SIGTERM, signal.SIGKILL]
    assert outcome.error is not None
    assert outcome.error.code == "timeout"


async def test_a_cancel_is_forwarded_and_the_tools_answer_stands() -> None:
    cancel = asyncio.Event()
    cancel.set()
    worker = WorkerTwin()
    run = asyncio.create_task(
        drive(job=JOB, limits=LIMITS, ctx=context(cancel=cancel), worker=worker)
    )
    await worker.waiting.wait()
    assert worker.sent[-1] == {"kind": "cancel"}
    worker.push(done(usage={}, error={"code": "cancelled", "message": "stopped"}))
    outcome = await run
    assert outcome.error is not None
    assert outcome.error.code == "cancelled"


async def test_a_cancelled_run_kills_the_worker_at_once_and_stays_cancelled() -> None:
    worker = WorkerTwin()
    run = asyncio.create_task(drive(job=JOB, limits=LIMITS, ctx=context(), worker=worker))
    await worker.waiting.wait()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    assert worker.signals == [signal.SIGKILL]
    assert worker.exited.done()


async def test_the_workers_checkpoint_call_is_answered_by_the_executors_context() -> None:
    checkpoints = Checkpoints()
    call = {
        "kind": "call",
        "id": 7,
        "method": "checkpoint",
        "args": {"state": {"step": 2}, "progress_percent": 50.0, "current_phase": "half"},
    }
    worker = WorkerTwin(frames=[call])
    run = asyncio.create_task(
        drive(job=JOB, limits=LIMITS, ctx=context(checkpoints=checkpoints), worker=worker)
    )
    await worker.replied.wait()
    assert worker.sent[-1] == {"kind": "reply", "id": 7, "value": "cp-1"}
    assert checkpoints.saved[0].state == {"step": 2}
    worker.push(done(usage={}, result={}))
    assert (await run).result == {}


async def test_a_done_frame_that_is_not_an_answer_ends_the_run_with_a_protocol_error() -> None:
    worker = WorkerTwin(frames=[done(usage={})])
    with pytest.raises(ProtocolError):
        await drive(job=JOB, limits=LIMITS, ctx=context(), worker=worker)
    assert worker.signals == [signal.SIGKILL]
