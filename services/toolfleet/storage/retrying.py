"""Retry until stopped: the one loop for "try again with backoff until it works, or we stop".

Reconnecting listeners (Redis pub/sub, the console feed's ``LISTEN``), patient writes
(checkpoints), polls for a free slot and short waits for a record to appear all run their
step through :func:`retry_until_stopped`, on tenacity:

- the pause after each failure doubles up to a ceiling, drawn from its upper half
  (jitter that keeps a floor, so a fleet does not reconnect in step nor hammer);
- a ``stop`` event ends the loop at once, even mid-pause, and a cancel ends it at once
  too (it is never taken for one more failure);
- only what ``retry_on`` names is tried again; anything else is raised at once;
- each failure is logged by its type's name only: an error's message may carry a DSN,
  a key or a payload.

A step that got far enough (a listener that reconnected) calls
:meth:`UntilStopped.made_progress`, so the next failure waits the shortest pause again.
Clock, sleep and jitter are injectable: the tests never sleep.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tenacity import AsyncRetrying, RetryCallState

log = logging.getLogger(__name__)
T = TypeVar("T")

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """The pauses between tries: the ceiling of the pause after the n-th failure."""

    first_s: float
    """Ceiling after the first failure; it doubles after each further one..."""
    max_s: float
    """... up to this."""
    steps: tuple[float, ...] = ()
    """Explicit ceilings for the first failures (``listed``); past them, doubling resumes."""

    @classmethod
    def listed(cls, steps: tuple[float, ...]) -> Backoff:
        """The ceilings ``steps``, one per failure, and the last one after that (none:
        no pause)."""
        if not steps:
            return cls(first_s=0.0, max_s=0.0)
        return cls(first_s=steps[0], max_s=steps[-1], steps=steps)

    def ceiling(self, failures: int) -> float:
        """The longest pause after ``failures`` failures in a row (1 or more)."""
        if failures <= len(self.steps):
            return self.steps[failures - 1]
        return min(self.max_s, self.first_s * 2.0 ** (failures - 1))


@dataclass(kw_only=True)
class UntilStopped(Generic[T]):
    """How one call site retries; :meth:`run` runs a step under it.

    Ends with the step's result; ``None`` when ``stop`` was set or ``give_up`` said so
    first; the last error when ``tries`` or ``patience_s`` ran out (or, for a step
    retried on its result by ``again``, that last result).
    """

    what: str
    """The warning logged on each failure (``"subscription lost; reconnecting"``)."""
    backoff: Backoff
    retry_on: tuple[type[Exception], ...] | Callable[[Exception], bool] = ()
    """The exceptions tried again (types, or a predicate); any other is raised at once."""
    again: Callable[[T], bool] | None = None
    """Also try again while the step's result says so (a slot not free yet): unlogged."""
    stop: asyncio.Event | None = None
    """Ends the loop at once when set, even mid-pause; set already: nothing is tried."""
    give_up: Callable[[], Awaitable[bool]] | None = None
    """Asked after each failed try: True ends the loop (returning ``None``)."""
    tries: int | None = None
    """Tries in all, the first included; None: no limit."""
    patience_s: float | None = None
    """The last try is this long after the first (the pause before it is cut short)."""
    after_failure: Callable[[Exception], None] | None = None
    """Told of each failure that is tried again (a listener's subscription is lost)."""
    log_extra: Mapping[str, object] = field(default_factory=dict)
    """More fields for the warning: names, never secrets."""
    clock: Callable[[], float] = time.monotonic
    sleep: Sleep = asyncio.sleep
    jitter: Callable[[float, float], float] = random.uniform

    _base: int = field(default=0, init=False)
    _attempt: int = field(default=0, init=False)
    _deadline: float | None = field(default=None, init=False)
    _stopped: bool = field(default=False, init=False)
    _replaying: bool = field(default=False, init=False)
    """Tenacity's first attempt is a replay of a try :meth:`run` judged already."""

    def made_progress(self) -> None:
        """The try under way got far enough: the next failure pauses the shortest again."""
        self._base = self._attempt - 1

    async def run(self, step: Callable[[], Awaitable[T]]) -> T | None:
        """Run ``step`` until it returns (and ``again`` is content), or the loop ends."""
        if self.stop is not None and self.stop.is_set():
            return None
        self._base, self._attempt = 0, 1  # the first try is under way (made_progress)
        self._stopped = False
        self._deadline = None if self.patience_s is None else self.clock() + self.patience_s
        # The first try runs outside tenacity: most loops end on it (a free slot, a write
        # that lands), and building tenacity's machinery cost more than the step (a
        # fifth of an executor call's CPU). A try it does not end on is handed to
        # tenacity as its first attempt, replayed: the pauses, hooks and stops that
        # follow are tenacity's, exactly as if it had run that try itself.
        first: _Replay[T]
        try:
            result = await step()
        except Exception as exc:  # a cancel (BaseException) ends the loop at once
            if not self._retried(exc):
                raise
            first = _Replay(error=exc)
        else:
            if self.again is None or not self.again(result):
                return result
            first = _Replay(result=result)
        return await self._retry(step, first)

    async def _retry(self, step: Callable[[], Awaitable[T]], first: _Replay[T]) -> T | None:
        """Tenacity's loop, its first attempt being the try :meth:`run` made already."""
        retrying = AsyncRetrying(
            retry=self._should_retry,
            stop=self._should_stop,  # type: ignore[arg-type]  # tenacity awaits an async stop
            wait=self._pause_s,
            sleep=self._pause,
            before=self._before,
            after=self._after,
            before_sleep=self._before_sleep,
            retry_error_callback=self._ended,
            reraise=True,
        )
        replay: _Replay[T] | None = first

        async def attempt() -> T:  # a coroutine function: tenacity awaits what it returns
            nonlocal replay
            if replay is None:
                return await step()
            done, replay = replay, None
            if done.error is not None:
                raise done.error
            return done.result  # type: ignore[return-value]  # set when error is None

        self._replaying = True
        try:
            result: T | None = await retrying(attempt)
        except _Stopped:
            return None
        return result

    # --- tenacity's hooks --------------------------------------------------------------

    def _before(self, state: RetryCallState) -> None:
        self._attempt = state.attempt_number

    def _retried(self, exc: BaseException) -> bool:
        if not isinstance(exc, Exception):
            return False  # a cancel ends it at once, never "one more failure"
        if isinstance(self.retry_on, tuple):
            return isinstance(exc, self.retry_on)
        return self.retry_on(exc)

    def _should_retry(self, state: RetryCallState) -> bool:
        if self._replaying:  # judged by run() already: ``again`` and ``retry_on`` are asked once
            self._replaying = False
            return True
        outcome = state.outcome
        if outcome is None:  # pragma: no cover - tenacity asks after a try
            return False
        if outcome.failed:
            exc = outcome.exception()
            return exc is not None and self._retried(exc)
        return self.again is not None and self.again(outcome.result())

    def _after(self, state: RetryCallState) -> None:
        exc = _failure(state)
        if exc is not None and self.after_failure is not None:
            self.after_failure(exc)

    def _pause_s(self, state: RetryCallState) -> float:
        ceiling = self.backoff.ceiling(max(state.attempt_number - self._base, 1))
        pause = self.jitter(ceiling / 2, ceiling)
        if self._deadline is not None:  # the last try is at the deadline
            pause = max(0.0, min(pause, self._deadline - self.clock()))
        return pause

    async def _should_stop(self, state: RetryCallState) -> bool:
        if self.stop is not None and self.stop.is_set():
            self._stopped = True
            return True
        if self.give_up is not None and await self.give_up():
            self._stopped = True
            return True
        if self.tries is not None and state.attempt_number >= self.tries:
            return True
        return self._deadline is not None and self.clock() >= self._deadline

    def _before_sleep(self, state: RetryCallState) -> None:
        exc = _failure(state)
        if exc is not None:
            log.warning(
                self.what,
                extra={
                    **self.log_extra,
                    "error": type(exc).__name__,
                    "retry_in_s": round(state.upcoming_sleep, 3),
                },
            )

    async def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when ``stop`` is set meanwhile."""
        if self.stop is None:
            await self.sleep(seconds)
            return
        if self.stop.is_set():
            return
        sleeping = asyncio.ensure_future(self.sleep(seconds))
        stopped = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait([sleeping, stopped], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeping, stopped):
                task.cancel()
        if self.stop.is_set():
            raise _Stopped  # tenacity would try once more after any pause

    def _ended(self, state: RetryCallState) -> T | None:
        if self._stopped:
            return None
        outcome = state.outcome
        assert outcome is not None
        return outcome.result()  # type: ignore[no-any-return]  # raises the last error


async def retry_until_stopped(
    step: Callable[[], Awaitable[T]],
    *,
    what: str,
    backoff: Backoff,
    retry_on: tuple[type[Exception], ...] | Callable[[Exception], bool] = (),
    again: Callable[[T], bool] | None = None,
    stop: asyncio.Event | None = None,
    give_up: Callable[[], Awaitable[bool]] | None = None,
    tries: int | None = None,
    patience_s: float | None = None,
    log_extra: Mapping[str, object] | None = None,
    sleep: Sleep = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T | None:
    """Run ``step`` under :class:`UntilStopped` (see there for the arguments)."""
    policy: UntilStopped[T] = UntilStopped(
        what=what,
        backoff=backoff,
        retry_on=retry_on,
        again=again,
        stop=stop,
        give_up=give_up,
        tries=tries,
        patience_s=patience_s,
        log_extra=log_extra or {},
        sleep=sleep,
        clock=clock,
    )
    return await policy.run(step)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Replay(Generic[T]):
    """How the first try ended: its result, or the error it raised (to retry)."""

    result: T | None = None
    error: Exception | None = None


class _Stopped(Exception):
    """``stop`` was set during a pause: no further try."""


def _failure(state: RetryCallState) -> Exception | None:
    outcome = state.outcome
    if outcome is None or not outcome.failed:
        return None
    exc = outcome.exception()
    return exc if isinstance(exc, Exception) else None
