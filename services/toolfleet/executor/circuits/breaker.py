"""Circuit breakers: a pure state machine, and the breaker that runs it over a store port.

Closed: calls pass and are kept in a window, either the last ``window_size`` calls
(``window="count"``) or the calls of the last ``window_s`` seconds (``window="time"``,
each with its time, pruned whenever a call is recorded); once at least ``minimum_calls``
are in the window a failure rate or slow-call rate at or above its threshold opens the
circuit. Open: calls fail fast (``circuit_breaker_open`` with the time left) for
``open_s``. Then half-open, by ``half_open_strategy``: ``all_or_nothing`` lets
``half_open_calls`` trial calls through at once and closes when all succeed (and are
fast); ``canary`` lets one trial through at a time, the next only once the previous
succeeded, and closes after ``half_open_calls`` successes. Any failed trial re-opens it.

The state is shared by every executor: :class:`CircuitBreaker` reads it from a
:class:`CircuitStore`, computes the next state here, and writes it back with a
compare-and-swap, so two executors never both apply a transition. Clocks are the
executors' wall clocks (seconds); circuits tolerate the skew of NTP-synced hosts.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import IntFlag, StrEnum
from typing import Protocol

from toolfleet.coalescing import Coalescer
from toolfleet.tools.resilience import Breaker

log = logging.getLogger(__name__)


class CircuitStatus(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Mark(IntFlag):
    """One call in the window: a success is 0."""

    FAILED = 1
    SLOW = 2


class Verdict(StrEnum):
    """How a finished call counts for its circuit."""

    SUCCESS = "success"
    FAILURE = "failure"
    IGNORED = "ignored"
    """Says nothing about the upstream (bad parameters, cancelled): not counted."""


@dataclass(frozen=True, kw_only=True)
class CallOutcome:
    verdict: Verdict
    duration_s: float


@dataclass(frozen=True, kw_only=True)
class CircuitState:
    status: CircuitStatus = CircuitStatus.CLOSED
    since: float = 0.0
    """When the circuit entered ``status`` (epoch seconds); for a circuit that never
    opened, when its first call was recorded. 0: unknown (a state written before this
    was recorded, until its next call)."""
    window: tuple[int, ...] = ()
    """The latest calls while closed, oldest first, as :class:`Mark` values."""
    times: tuple[float, ...] = ()
    """With a time window: when each call of ``window`` was recorded; else empty."""
    trials_started: int = 0
    """Half-open trial calls let through so far."""
    trials_succeeded: int = 0
    """Half-open trial calls that succeeded so far."""
    trial_at: float = 0.0
    """Canary: when the latest trial after the first was let through (0: none yet)."""

    def to_json(self) -> str:
        data: dict[str, object] = {
            "status": self.status.value,
            "since": self.since,
            "window": list(self.window),
            "trials_started": self.trials_started,
            "trials_succeeded": self.trials_succeeded,
        }
        # Written only when used, so count windows and all-or-nothing trials keep the
        # format older executors read (they ignore keys they do not know).
        if self.times:
            data["times"] = list(self.times)
        if self.trial_at:
            data["trial_at"] = self.trial_at
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> CircuitState:
        if not raw:
            return cls()
        return _parsed(raw)

    @classmethod
    def _from_json(cls, raw: str) -> CircuitState:
        data = json.loads(raw)
        return cls(
            status=CircuitStatus(data["status"]),
            since=float(data.get("since") or 0.0),
            window=tuple(int(m) for m in data["window"]),
            trials_started=int(data["trials_started"]),
            trials_succeeded=int(data["trials_succeeded"]),
            times=tuple(float(t) for t in data.get("times", ())),
            trial_at=float(data.get("trial_at", 0.0)),
        )


@functools.lru_cache(maxsize=256)
def _parsed(raw: str) -> CircuitState:
    """A state read back: the calls of a busy circuit read the same JSON, parsed once
    (the state is frozen, so they can share it)."""
    return CircuitState._from_json(raw)


@dataclass(frozen=True, kw_only=True)
class Transition:
    """A change of status, published and turned into ``ai.agent.circuit.*`` events."""

    circuit_name: str
    status: CircuitStatus
    reason: str
    retry_after_s: float | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "circuit_name": self.circuit_name,
                "state": self.status.value,
                "reason": self.reason,
                "retry_after_s": self.retry_after_s,
            }
        )


@dataclass(frozen=True, kw_only=True)
class Step:
    """The result of one state-machine step."""

    state: CircuitState
    transition: Transition | None = None
    allowed: bool = True
    retry_after_s: float = 0.0
    """When not allowed: seconds until a call may pass."""
    read: str | None = field(default=None, compare=False)
    """The stored state's JSON this step was taken on, when it wrote nothing (``peek``):
    pass it to the call's first :meth:`CircuitBreaker.before_call`, which then needs no
    read of its own."""


def admit(name: str, state: CircuitState, policy: Breaker, now: float) -> Step:
    """May a call go through now? Half-open hands out its trial permits here."""
    match state.status:
        case CircuitStatus.CLOSED:
            return Step(state=state)
        case CircuitStatus.OPEN:
            left = state.since + policy.open_s - now
            if left > 0:
                return Step(state=state, allowed=False, retry_after_s=left)
            return _start_trials(name, now, "open time elapsed")
        case CircuitStatus.HALF_OPEN:
            if policy.half_open_strategy == "canary":
                # One trial at a time: the next once the previous one succeeded.
                if state.trials_started <= state.trials_succeeded:
                    return Step(
                        state=replace(state, trials_started=state.trials_started + 1, trial_at=now)
                    )
            elif state.trials_started < policy.half_open_calls:
                return Step(state=replace(state, trials_started=state.trials_started + 1))
            # Trials whose executor died never report: start over once they are stale
            # (a canary counts from when it was let through).
            stale_after = max(state.since, state.trial_at) + policy.open_s + policy.slow_call_s
            if now >= stale_after:
                return _start_trials(name, now, "half-open trials went stale")
            return Step(state=state, allowed=False, retry_after_s=max(stale_after - now, 0.0))


def record(
    name: str, state: CircuitState, policy: Breaker, now: float, outcome: CallOutcome
) -> Step:
    """Count a finished call; may open or close the circuit."""
    mark = Mark(0)
    if outcome.verdict is Verdict.FAILURE:
        mark |= Mark.FAILED
    if outcome.duration_s > policy.slow_call_s:
        mark |= Mark.SLOW
    match state.status:
        case CircuitStatus.CLOSED:
            if outcome.verdict is Verdict.IGNORED:
                return Step(state=state)
            if policy.window == "time":
                window, times = _recent(state, policy, now)
                cap = policy.max_time_window_calls
                window, times = (*window, int(mark))[-cap:], (*times, now)[-cap:]
            else:
                window, times = (*state.window, int(mark))[-policy.window_size :], ()
            reason = _trip_reason(window, policy)
            if reason:
                return _open(name, now, policy, reason)
            # A circuit first seen (or stored before ``since`` was kept) starts now.
            since = state.since or now
            return Step(state=replace(state, window=window, times=times, since=since))
        case CircuitStatus.HALF_OPEN:
            if outcome.verdict is Verdict.IGNORED:
                return Step(state=replace(state, trials_started=max(state.trials_started - 1, 0)))
            if mark:
                return _open(name, now, policy, "a half-open trial call failed")
            succeeded = state.trials_succeeded + 1
            if succeeded >= policy.half_open_calls:
                return Step(
                    state=CircuitState(status=CircuitStatus.CLOSED, since=now),
                    transition=Transition(
                        circuit_name=name,
                        status=CircuitStatus.CLOSED,
                        reason=f"{succeeded} half-open trial calls succeeded",
                    ),
                )
            return Step(state=replace(state, trials_succeeded=succeeded))
        case CircuitStatus.OPEN:
            return Step(state=state)  # a call admitted before it opened: already counted


def _recent(
    state: CircuitState, policy: Breaker, now: float
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """The calls of a time window still inside it at ``now``, and their times."""
    if len(state.times) != len(state.window):
        return (), ()  # kept by a count window: their times are unknown
    horizon = now - policy.window_s
    kept = [(m, t) for m, t in zip(state.window, state.times, strict=True) if t > horizon]
    return tuple(m for m, _ in kept), tuple(t for _, t in kept)


def _trip_reason(window: tuple[int, ...], policy: Breaker) -> str:
    if len(window) < policy.minimum_calls:
        return ""
    failed, slow_mark = int(Mark.FAILED), int(Mark.SLOW)  # int arithmetic: no enum per call
    failures = sum(1 for m in window if m & failed)
    slow = sum(1 for m in window if m & slow_mark)
    calls = (
        f"of the {len(window)} calls of the last {policy.window_s:g}s"
        if policy.window == "time"
        else f"of the last {len(window)} calls"
    )
    if failures / len(window) >= policy.failure_rate:
        return f"{failures} {calls} failed"
    if slow / len(window) >= policy.slow_call_rate:
        return f"{slow} {calls} were slower than {policy.slow_call_s:g}s"
    return ""


def _open(name: str, now: float, policy: Breaker, reason: str) -> Step:
    return Step(
        state=CircuitState(status=CircuitStatus.OPEN, since=now),
        transition=Transition(
            circuit_name=name, status=CircuitStatus.OPEN, reason=reason, retry_after_s=policy.open_s
        ),
    )


def _start_trials(name: str, now: float, reason: str) -> Step:
    return Step(
        state=CircuitState(status=CircuitStatus.HALF_OPEN, since=now, trials_started=1),
        transition=Transition(circuit_name=name, status=CircuitStatus.HALF_OPEN, reason=reason),
    )


class CircuitStore(Protocol):
    """Shared circuit state with compare-and-swap (:mod:`toolfleet.executor.circuits.store`)."""

    async def load(self, name: str) -> str:
        """The state's JSON, or "" for a circuit never used."""
        ...

    async def swap(self, name: str, expected: str, new: str, transition: str) -> bool:
        """Write ``new`` if the state is still ``expected``, publishing ``transition`` if any."""
        ...


@dataclass(frozen=True, slots=True)
class _Report:
    """A finished call waiting to be recorded."""

    policy: Breaker
    outcome: CallOutcome


@dataclass(kw_only=True)
class CircuitBreaker:
    """Runs :func:`admit` / :func:`record` against the shared state, race-free."""

    store: CircuitStore
    clock: Callable[[], float]
    max_swaps: int = 16
    """Compare-and-swap attempts before a step is given up (fail open, sample dropped)."""
    _reports: dict[str, Coalescer[_Report, Step]] = field(
        default_factory=dict, init=False, repr=False
    )
    _written: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    """Each circuit's state as this process last read or wrote it: a record's first
    compare-and-swap tries it instead of reading first (another executor's write since
    makes the swap fail, and the state is read then)."""

    async def before_call(self, name: str, policy: Breaker, *, read: str | None = None) -> Step:
        """May the call go through? ``read``: the state as this call's :meth:`peek` read
        it a moment ago (:attr:`Step.read`), taken instead of reading it again."""
        return await self._step(name, lambda s, now: admit(name, s, policy, now), read=read)

    def after_call(self, name: str, policy: Breaker, outcome: CallOutcome) -> asyncio.Future[Step]:
        """Record a finished call, queued at once; the step it caused (its transition, if
        any) is the future's, so the report is on its way while the caller goes on, with
        no task of its own.

        Every finished call changes the window, so each would be a compare-and-swap on
        the one key all executors share, and the calls of a busy tool would keep losing
        the race to each other. Instead the calls of a circuit that finish while its
        last write is under way are folded, in order, into the next write: the state is
        the one they would have made one by one, in one round trip. A fold stops at the
        first call that changes the circuit's status, so each write publishes at most
        one transition; the calls after it go into the next write.
        """
        reports = self._reports.get(name)
        if reports is None:
            reports = self._reports[name] = Coalescer(functools.partial(self._fold, name))
        return reports.enqueue(_Report(policy, outcome))

    async def _fold(self, name: str, batch: Sequence[_Report]) -> list[Step]:
        """Record a prefix of ``batch`` in one write; the steps of the calls recorded."""
        known = self._written.get(name)
        for _ in range(self.max_swaps):
            raw = known if known is not None else await self.store.load(name)
            current = CircuitState.from_json(raw)
            now = self.clock()
            state, steps = current, []
            for report in batch:
                step = record(name, state, report.policy, now, report.outcome)
                steps.append(step)
                state = step.state
                if step.transition is not None:
                    break
            if state == current:
                if known is not None:  # nothing to write, judged on what may be stale
                    known = None
                    continue
                self._written[name] = raw
                return steps
            last = steps[-1].transition
            new = state.to_json()
            if await self.store.swap(name, raw, new, last.to_json() if last else ""):
                self._written[name] = new
                if last is not None:
                    log.info("circuit %s", last.status.value, extra={"circuit": name})
                return steps
            known = None
        log.warning("circuit state kept changing; calls not recorded", extra={"circuit": name})
        return [Step(state=CircuitState()) for _ in batch]

    async def peek(self, name: str, policy: Breaker) -> Step:
        """What :meth:`before_call` would say for an open circuit, changing nothing."""
        raw = await self.store.load(name)
        self._written[name] = raw
        state = CircuitState.from_json(raw)
        if state.status is CircuitStatus.OPEN:
            return replace(admit(name, state, policy, self.clock()), read=raw)
        return Step(state=state, read=raw)

    async def _step(
        self, name: str, fn: Callable[[CircuitState, float], Step], *, read: str | None = None
    ) -> Step:
        for _ in range(self.max_swaps):
            raw = read if read is not None else await self.store.load(name)
            read = None  # a swap that fails reads the state again
            self._written[name] = raw
            current = CircuitState.from_json(raw)
            step = fn(current, self.clock())
            if step.state == current:
                return step
            transition = step.transition.to_json() if step.transition else ""
            new = step.state.to_json()
            if await self.store.swap(name, raw, new, transition):
                self._written[name] = new
                if step.transition is not None:
                    log.info("circuit %s", step.transition.status.value, extra={"circuit": name})
                return step
        log.warning("circuit state kept changing; step skipped", extra={"circuit": name})
        return Step(state=CircuitState())
