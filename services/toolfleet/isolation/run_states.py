"""The states of one isolated run, and the one place its outcome is decided.

The executor drives a run (:mod:`toolfleet.isolation.drive`) and reports what happened
to a :class:`RunMachine` as :class:`RunEvent` s; :func:`step` is the whole table of
transitions. When the run has ended, :func:`decide` turns its :class:`RunEnd` into the
:class:`IsolatedResult`::

    STARTING --sent--> SERVING --answered----------> ANSWERED   --overflowed--> OVERFLOWED
        |                 |-----answered_unmeasured-> UNMEASURED --overflowed--> OVERFLOWED
        '---hung_up-------+-----hung_up-------------> HUNG_UP    --overflowed--> OVERFLOWED
                          '-----expired-------------> TIMED_OUT  (stays: the clock ended it)
    STARTING or SERVING --aborted--> ABORTED  (cancelled, or serving raised: no outcome)

How each end is settled (the worker's side effects) is read from the state too:
:attr:`RunState.lingers` (the worker may finish dying on its own for the kill grace),
:attr:`RunState.terminated` (SIGTERM first), :attr:`RunState.keeps_worker` (it exits by
itself; nothing to kill or to wait for).
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from toolfleet.errors import (
    ErrorInfo,
    ResourceExhausted,
    SandboxFailure,
    ToolfleetError,
    ToolTimeout,
)
from toolfleet.isolation.protocol import Done
from toolfleet.isolation.worker import Exit
from toolfleet.tools.limits import RunLimits


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """What a run used, from the kernel."""

    cpu_millicore_seconds: int = 0
    memory_peak_mb: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class IsolatedResult:
    result: dict[str, Any] | None = None
    error: ErrorInfo | None = None
    usage: Usage = field(default_factory=Usage)


class RunState(enum.Enum):
    """Where one run is."""

    STARTING = "starting"
    """The worker is ready; the job is not sent yet."""
    SERVING = "serving"
    """The job is sent: the worker's calls are answered, a cancel forwarded."""
    ANSWERED = "answered"
    """Its ``done`` frame came, with its usage: it exits by itself."""
    UNMEASURED = "unmeasured"
    """A ``done`` frame without usage: the answer stands, the worker is killed and measured."""
    HUNG_UP = "hung_up"
    """It closed its socket without an answer: judged by how it exited."""
    TIMED_OUT = "timed_out"
    """The wall clock ran out: SIGTERM to its group, SIGKILL after the grace."""
    OVERFLOWED = "overflowed"
    """Its stdout and stderr went over the limit (the drain killed it)."""
    ABORTED = "aborted"
    """Cancelled (a cancel past its grace, a lost lease, shutdown) or serving raised:
    the worker is killed and the exception goes on; there is no outcome."""

    @property
    def keeps_worker(self) -> bool:
        """Nothing to kill or wait for: it answered and exits by itself."""
        return self is RunState.ANSWERED

    @property
    def terminated(self) -> bool:
        """Its group gets SIGTERM before the kill grace."""
        return self is RunState.TIMED_OUT

    @property
    def lingers(self) -> bool:
        """It may finish dying on its own for the kill grace before it is killed."""
        return self in (RunState.HUNG_UP, RunState.TIMED_OUT, RunState.ABORTED)


class RunEvent(enum.Enum):
    """What the driver saw."""

    SENT = "sent"
    ANSWERED = "answered"
    ANSWERED_UNMEASURED = "answered_unmeasured"
    HUNG_UP = "hung_up"
    """The socket closed, or sending on it failed."""
    EXPIRED = "expired"
    """The run's own wall-clock deadline (not another timeout inside it)."""
    OVERFLOWED = "overflowed"
    ABORTED = "aborted"


_S, _E = RunState, RunEvent

TRANSITIONS: Mapping[tuple[RunState, RunEvent], RunState] = {
    (_S.STARTING, _E.SENT): _S.SERVING,
    (_S.STARTING, _E.HUNG_UP): _S.HUNG_UP,
    (_S.STARTING, _E.ABORTED): _S.ABORTED,
    (_S.SERVING, _E.ANSWERED): _S.ANSWERED,
    (_S.SERVING, _E.ANSWERED_UNMEASURED): _S.UNMEASURED,
    (_S.SERVING, _E.HUNG_UP): _S.HUNG_UP,
    (_S.SERVING, _E.EXPIRED): _S.TIMED_OUT,
    (_S.SERVING, _E.ABORTED): _S.ABORTED,
    (_S.ANSWERED, _E.OVERFLOWED): _S.OVERFLOWED,
    (_S.UNMEASURED, _E.OVERFLOWED): _S.OVERFLOWED,
    (_S.HUNG_UP, _E.OVERFLOWED): _S.OVERFLOWED,
    (_S.TIMED_OUT, _E.OVERFLOWED): _S.TIMED_OUT,
}
"""Every legal transition; any other pair is a bug in the driver."""


class InvalidTransition(RuntimeError):
    """An event the run's state does not accept."""


def step(state: RunState, event: RunEvent) -> RunState:
    """The state after ``event``."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise InvalidTransition(f"{event.value} in state {state.value}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnd:
    """Everything :func:`decide` needs of an ended run."""

    state: RunState
    done: Done | None = None
    exit: Exit | None = None
    """How the worker ended (None: it answered and was not waited for)."""
    seen: tuple[float, int] = (0.0, 0)
    """CPU seconds and peak kB of its descendants, read before it was killed."""
    baseline_cpu_s: float = 0.0
    """CPU the worker had used when it was ready (not the call's)."""


@dataclass(slots=True)
class RunMachine:
    """One run's state, what it answered and what was measured before a kill."""

    state: RunState = RunState.STARTING
    done: Done | None = None
    seen: tuple[float, int] = (0.0, 0)

    def fire(self, event: RunEvent) -> RunState:
        self.state = step(self.state, event)
        return self.state

    def answer(self, done: Done | None) -> RunState:
        """The end of serving: the worker's ``done`` frame, or None (it hung up)."""
        if done is None:
            return self.fire(RunEvent.HUNG_UP)
        self.done = done
        measured = done.usage is not None
        return self.fire(RunEvent.ANSWERED if measured else RunEvent.ANSWERED_UNMEASURED)

    def saw(self, snapshot: tuple[float, int]) -> None:
        self.seen = max(self.seen, snapshot)

    def end(self, exit_: Exit | None, *, baseline_cpu_s: float) -> RunEnd:
        return RunEnd(
            state=self.state,
            done=self.done,
            exit=exit_,
            seen=self.seen,
            baseline_cpu_s=baseline_cpu_s,
        )


def decide(end: RunEnd, *, tool_id: str, limits: RunLimits) -> IsolatedResult:
    """The outcome of an ended run: the one place it is decided."""
    usage = _usage_of(end)
    error: ToolfleetError
    match end.state:
        case RunState.ANSWERED | RunState.UNMEASURED:
            assert end.done is not None
            return IsolatedResult(result=end.done.result, error=end.done.error, usage=usage)
        case RunState.TIMED_OUT:
            error = ToolTimeout(f"{tool_id} did not finish within {limits.timeout_s:g}s")
        case RunState.OVERFLOWED:
            error = ResourceExhausted(
                f"{tool_id} wrote more than {limits.max_output_bytes} bytes of output"
            )
        case RunState.HUNG_UP:
            error = _unanswered(end.exit, tool_id=tool_id, limits=limits)
        case _:
            raise InvalidTransition(f"no outcome in state {end.state.value}")
    return IsolatedResult(error=error.to_error_info(), usage=usage)


def _unanswered(exit_: Exit | None, *, tool_id: str, limits: RunLimits) -> ToolfleetError:
    """Why a worker ended without an answer: its CPU limit (SIGXCPU, or the SIGKILL at the
    hard limit once its CPU time is spent), or anything else (the signal named)."""
    assert exit_ is not None
    if exit_.signal == signal.SIGXCPU or (
        exit_.signal == signal.SIGKILL and exit_.cpu_s >= limits.cpu_seconds
    ):
        return ToolTimeout(f"{tool_id} used its {limits.cpu_seconds}s of CPU time")
    how = (
        f"signal {signal.Signals(exit_.signal).name}"
        if exit_.signal is not None
        else f"status {exit_.code}"
    )
    return SandboxFailure(f"{tool_id}'s worker ended without an answer ({how})")


def _usage_of(end: RunEnd) -> Usage:
    """What it reported of itself when it answered and was not killed; else the most of
    that, of what the kernel reported when it was reaped, and of what was seen before."""
    reported = end.done.usage if end.done is not None else None
    cpu_s = reported.cpu_s if reported is not None else 0.0
    maxrss_kb = reported.maxrss_kb if reported is not None else 0
    if end.exit is not None:
        cpu_s = max(end.exit.cpu_s, end.seen[0], cpu_s)
        maxrss_kb = max(end.exit.maxrss_kb, end.seen[1], maxrss_kb)
    return usage(cpu_s=cpu_s, maxrss_kb=maxrss_kb, baseline_cpu_s=end.baseline_cpu_s)


def usage(*, cpu_s: float, maxrss_kb: int, baseline_cpu_s: float) -> Usage:
    """CPU since the worker was ready (a warm worker's start is not the call's), peak RSS."""
    return Usage(
        cpu_millicore_seconds=max(1, round(max(0.0, cpu_s - baseline_cpu_s) * 1000)),
        memory_peak_mb=max(1, round(maxrss_kb / 1024)),
    )


__all__ = [
    "TRANSITIONS",
    "InvalidTransition",
    "IsolatedResult",
    "RunEnd",
    "RunEvent",
    "RunMachine",
    "RunState",
    "Usage",
    "decide",
    "step",
    "usage",
]
