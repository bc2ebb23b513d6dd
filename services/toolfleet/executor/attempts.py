"""One invocation's attempts: the retry loop and the circuit breaker around each run.

Retries follow the tool's :class:`~toolfleet.tools.resilience.Retry` through tenacity:
only errors whose class is retryable (:func:`toolfleet.errors.is_retryable`) are
retried, after an exponential backoff with full jitter (``wait_random_exponential``).
Every attempt builds a fresh context from the latest checkpoint, so a retry resumes
rather than starts over. A cancel during a backoff wait ends the call as ``cancelled``.

Every attempt first asks the tool's circuit for a permit and reports its outcome after.
An open circuit ends the call with ``circuit_breaker_open`` (never retried here: the
error's ``retry_after_s`` tells the caller when to come back). The report of an attempt
that is retried is done before the retry; the last attempt's is queued and handed to the
caller (:attr:`AttemptsResult.reported`), so its round trip overlaps what the caller
does next (the lease's claim of the outcome) instead of coming before it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from toolfleet.errors import (
    Cancelled,
    CircuitBreakerOpen,
    ErrorCode,
    error_from,
    is_retryable,
)
from toolfleet.executor.circuits.breaker import (
    CallOutcome,
    CircuitBreaker,
    Step,
    Transition,
    Verdict,
)
from toolfleet.executor.runner import RunResult, run_tool
from toolfleet.tools.context import ToolContext
from toolfleet.tools.spec import ToolSpec

#: Errors that say the tool's upstream is unhealthy; other errors do not move a circuit.
CIRCUIT_FAILURES = frozenset(
    {
        ErrorCode.TOOL_EXECUTION_ERROR,
        ErrorCode.SANDBOX_FAILURE,
        ErrorCode.EXTERNAL_API_ERROR,
        ErrorCode.TIMEOUT,
    }
)


ToolRunner = Callable[[ToolSpec, dict[str, Any], ToolContext, float], Awaitable[RunResult]]
"""Runs one attempt: ``(spec, parameters, ctx, timeout_s)`` (isolated or in the loop)."""


async def run_in_loop(
    spec: ToolSpec, parameters: dict[str, Any], ctx: ToolContext, timeout_s: float
) -> RunResult:
    return await run_tool(spec, parameters, ctx, timeout_s=timeout_s)


@dataclass(frozen=True, kw_only=True)
class AttemptsInput:
    spec: ToolSpec
    parameters: dict[str, Any]
    timeout_s: float
    cancel_event: asyncio.Event
    context_for: Callable[[int], Awaitable[ToolContext]]
    """Builds the context of attempt ``n`` (from 1), with the latest checkpoint's state."""
    breaker: CircuitBreaker | None
    after_transition: Callable[[Transition, int], Awaitable[None]]
    """Called with each transition this call's attempts caused, and the attempt number;
    the transition is published (acknowledged) once it returns."""
    runner: ToolRunner = run_in_loop
    """Where each attempt runs (:class:`toolfleet.executor.isolated.IsolatedRunner`)."""
    circuit_read: str | None = None
    """The circuit's state as admission read it a moment ago: the first attempt's check
    takes it instead of reading it again (:attr:`~toolfleet.executor.circuits.breaker.
    Step.read`)."""


@dataclass(frozen=True, kw_only=True)
class AttemptsResult:
    result: RunResult
    attempts: int
    """Times the tool ran (0 when the circuit refused the first attempt)."""
    reported: PendingReport | None = None
    """The last attempt's report to its circuit, on its way (None: nothing to report).
    The caller settles it before the outcome leaves (:meth:`PendingReport.settle`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingReport:
    """An attempt's report to its circuit, queued with no task of its own."""

    step: asyncio.Future[Step]
    """The step the report takes (:meth:`CircuitBreaker.after_call`)."""
    attempt: int
    after_transition: Callable[[Transition, int], Awaitable[None]]

    async def settle(self) -> None:
        """Wait for the report (an error it met is raised here) and publish the transition
        it caused, if any."""
        step = await self.step
        if step.transition is not None:
            await self.after_transition(step.transition, self.attempt)

    def drop(self) -> None:
        """Not settled (the call failed on its way): the report is still written, and an
        error it meets is not reported as never retrieved."""
        self.step.cancel()


class _AttemptFailed(Exception):
    """A failed attempt that is not the last (:func:`_is_last`): tenacity retries it."""


class _Refused(Exception):
    """The circuit refused the attempt: never retried here."""

    def __init__(self, error: CircuitBreakerOpen) -> None:
        super().__init__(error.message)
        self.error = error


async def run_attempts(job: AttemptsInput) -> AttemptsResult:
    """Run ``job.spec`` until it succeeds, fails for good, or runs out of attempts.

    Cancellation (``asyncio.CancelledError``) propagates, as from :func:`run_tool`.
    """
    policy = job.spec.retry
    # Most calls end with their first attempt: it runs without the retry machinery,
    # which only takes over (from attempt 2, after attempt 1's backoff) for a retry.
    try:
        first, reported = await _one_attempt(job, 1)
    except (_Refused, Cancelled) as exc:
        error = exc.error if isinstance(exc, _Refused) else exc
        return AttemptsResult(result=RunResult(error=error.to_error_info()), attempts=0)
    if _is_last(job, 1, first):
        return AttemptsResult(result=first, attempts=1, reported=reported)

    async def backoff(seconds: float) -> None:
        if job.cancel_event.is_set():
            raise Cancelled("cancelled while waiting to retry")
        try:
            async with asyncio.timeout(seconds):
                await job.cancel_event.wait()
        except TimeoutError:
            return
        raise Cancelled("cancelled while waiting to retry")

    retrying = AsyncRetrying(
        stop=stop_after_attempt(policy.max_attempts),
        wait=wait_random_exponential(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s),
        # Whether to retry is _is_last's to say (it raises _AttemptFailed); the stop is a
        # backstop that never fires first.
        retry=retry_if_exception_type(_AttemptFailed),
        sleep=backoff,
        reraise=True,
    )
    ran, result = 0, first
    try:
        async for attempt in retrying:
            with attempt:
                number = attempt.retry_state.attempt_number
                if number > 1:
                    result, reported = await _one_attempt(job, number)
                ran = number
                if _is_last(job, number, result):
                    return AttemptsResult(result=result, attempts=ran, reported=reported)
                if reported is not None:  # before the retry, which reads what it wrote
                    await reported.settle()
                raise _AttemptFailed  # retried after its backoff
    except (_Refused, Cancelled) as exc:
        error = exc.error if isinstance(exc, _Refused) else exc
        return AttemptsResult(result=RunResult(error=error.to_error_info()), attempts=ran)
    raise AssertionError("tenacity stopped without an outcome")  # pragma: no cover


def _is_last(job: AttemptsInput, number: int, result: RunResult) -> bool:
    """Whether attempt ``number``, which ended with ``result``, is the call's last one:
    the retry rule (a retryable error with attempts left is retried), said once."""
    if result.error is None or number >= job.spec.retry.max_attempts:
        return True
    return not is_retryable(error_from(result.error))


async def _one_attempt(job: AttemptsInput, number: int) -> tuple[RunResult, PendingReport | None]:
    """Run the tool once under its circuit (raises :class:`_Refused` when it is open).

    Returns the run and its report to the circuit, under way (None: no breaker): the
    caller settles it, before a retry or with the outcome.
    """
    name = job.spec.circuit_name
    policy = job.spec.circuit_breaker
    if job.breaker is not None:
        read = job.circuit_read if number == 1 else None
        step = await job.breaker.before_call(name, policy, read=read)
        if step.transition is not None:
            await job.after_transition(step.transition, number)
        if not step.allowed:
            raise _Refused(
                CircuitBreakerOpen(
                    f"the circuit {name} is open; calls fail fast until it recovers",
                    details={"circuit": name},
                    retry_after_s=round(step.retry_after_s, 3),
                )
            )
    ctx = await job.context_for(number)
    started = time.monotonic()
    # A cancelled attempt reports nothing: a half-open permit it held goes stale and is
    # handed out again (see circuits.admit).
    result = await job.runner(job.spec, job.parameters, ctx, job.timeout_s)
    if job.breaker is None:
        return result, None
    outcome = CallOutcome(verdict=verdict_of(result), duration_s=time.monotonic() - started)
    return result, PendingReport(
        step=job.breaker.after_call(name, policy, outcome),
        attempt=number,
        after_transition=job.after_transition,
    )


def verdict_of(result: RunResult) -> Verdict:
    """How a run counts for its circuit."""
    if result.error is None:
        return Verdict.SUCCESS
    if result.error.code in CIRCUIT_FAILURES:
        return Verdict.FAILURE
    return Verdict.IGNORED
