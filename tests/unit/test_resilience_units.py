"""Retry loop, cache key and resilience declarations, offline."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from toolfleet.errors import ErrorCode, ExternalApiError, RegistrationError, ToolTimeout
from toolfleet.executor.attempts import AttemptsInput, AttemptsResult, run_attempts
from toolfleet.executor.cache import call_id
from toolfleet.executor.circuits.breaker import (
    CircuitBreaker,
    CircuitState,
    CircuitStatus,
    Transition,
)
from toolfleet.sdk import (
    Breaker,
    Cache,
    Resilience,
    Retry,
    Sandbox,
    ToolContext,
    ToolPermissions,
    spec_of,
    tool,
)

pytestmark = pytest.mark.unit


class In(BaseModel):
    fail_with: str = ""
    fail_times: int = 0


class Out(BaseModel):
    attempt: int
    resumed: dict[str, Any] | None


RUNS: list[int] = []


@tool(
    id="unit__retry",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["attempt"],
    resilience=Resilience(retry=Retry(max_attempts=3, initial_backoff_s=0, max_backoff_s=0)),
)
async def retried(params: In, ctx: ToolContext) -> Out:
    RUNS.append(ctx.attempt)
    if ctx.attempt <= params.fail_times:
        if params.fail_with == "timeout":
            raise ToolTimeout("slow upstream")
        raise ExternalApiError("503")
    return Out(attempt=ctx.attempt, resumed=ctx.resume_state())


def job(
    params: dict[str, Any],
    *,
    cancel: asyncio.Event | None = None,
    breaker: CircuitBreaker | None = None,
    transitions: list[Transition] | None = None,
) -> AttemptsInput:
    async def context_for(attempt: int) -> ToolContext:
        return ToolContext(
            tenant_id="t",
            agent_did="a",
            invocation_id="i",
            tool_id="unit__retry",
            tool_version="1.0.0",
            attempt=attempt,
            resume_state={"from": attempt - 1} if attempt > 1 else None,
        )

    async def after_transition(transition: Transition, attempt: int) -> None:
        if transitions is not None:
            transitions.append(transition)

    return AttemptsInput(
        spec=spec_of(retried),
        parameters=params,
        timeout_s=1,
        cancel_event=cancel or asyncio.Event(),
        context_for=context_for,
        breaker=breaker,
        after_transition=after_transition,
    )


@pytest.mark.parametrize("fail_with", ["external", "timeout"])
async def test_retryable_errors_are_retried_and_resume(fail_with: str) -> None:
    done = await run_attempts(job({"fail_times": 2, "fail_with": fail_with}))
    assert done.attempts == 3
    assert done.result.result == {"attempt": 3, "resumed": {"from": 2}}


async def test_last_error_is_reported_when_attempts_run_out() -> None:
    done = await run_attempts(job({"fail_times": 9}))
    assert done.attempts == 3
    assert done.result.error is not None
    assert done.result.error.code is ErrorCode.EXTERNAL_API_ERROR


async def test_non_retryable_errors_end_the_call() -> None:
    done = await run_attempts(job({"fail_times": "x"}))  # invalid parameters
    assert done.attempts == 1
    assert done.result.error is not None
    assert done.result.error.code is ErrorCode.INVALID_PARAMETERS


async def test_cancel_during_the_backoff_ends_as_cancelled() -> None:
    cancel = asyncio.Event()
    cancel.set()
    RUNS.clear()
    done = await run_attempts(job({"fail_times": 2}, cancel=cancel))
    assert done.result.error is not None
    assert done.result.error.code is ErrorCode.CANCELLED
    assert (done.attempts, RUNS) == (1, [1])


class Store:
    def __init__(self, state: CircuitState) -> None:
        self.raw = state.to_json()

    async def load(self, name: str) -> str:
        return self.raw

    async def swap(self, name: str, expected: str, new: str, transition: str) -> bool:
        self.raw = new
        return True


async def test_an_open_circuit_refuses_without_running() -> None:
    RUNS.clear()
    store = Store(CircuitState(status=CircuitStatus.OPEN, since=100))
    breaker = CircuitBreaker(store=store, clock=lambda: 105.0)
    done: AttemptsResult = await run_attempts(job({}, breaker=breaker))
    assert done.attempts == 0
    assert RUNS == []
    assert done.result.error is not None
    assert done.result.error.code is ErrorCode.CIRCUIT_BREAKER_OPEN
    assert done.result.error.retry_after_s == 25


async def test_failures_feed_the_circuit_and_its_transitions_are_reported() -> None:
    transitions: list[Transition] = []
    store = Store(CircuitState())
    breaker = CircuitBreaker(store=store, clock=lambda: 1.0)
    for _ in range(2):  # default policy: 5 calls in the window, 50 % failures
        done = await run_attempts(job({"fail_times": 9}, breaker=breaker, transitions=transitions))
        if done.reported is not None:  # None once the circuit refused the last attempt
            await done.reported.settle()
    assert [t.status for t in transitions] == [CircuitStatus.OPEN]
    assert CircuitState.from_json(store.raw).status is CircuitStatus.OPEN


class HeldStore(Store):
    """Each write waits until the test answers it."""

    def __init__(self) -> None:
        super().__init__(CircuitState())
        self.waiting: list[asyncio.Event] = []

    async def swap(self, name: str, expected: str, new: str, transition: str) -> bool:
        answered = asyncio.Event()
        self.waiting.append(answered)
        await answered.wait()
        return await super().swap(name, expected, new, transition)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_retry_waits_for_the_failed_attempts_report_the_result_for_none() -> None:
    store = HeldStore()
    breaker = CircuitBreaker(store=store, clock=lambda: 1.0)
    RUNS.clear()
    attempts = asyncio.create_task(run_attempts(job({"fail_times": 1}, breaker=breaker)))
    await settle()
    assert (RUNS, len(store.waiting)) == ([1], 1)  # attempt 2 waits for attempt 1's report
    store.waiting[0].set()
    await settle()
    assert (RUNS, len(store.waiting)) == ([1, 2], 2)
    # The last attempt's report is still held, and the result is back without it.
    done = await attempts
    assert (done.result.error, done.attempts) == (None, 2)
    assert done.reported is not None
    assert not done.reported.step.done()
    store.waiting[1].set()
    await done.reported.settle()
    assert CircuitState.from_json(store.raw).window == (1, 0)  # both attempts counted


async def test_without_a_breaker_nothing_is_left_to_report() -> None:
    done = await run_attempts(job({}))
    assert (done.attempts, done.reported) == (1, None)


def test_call_id_is_canonical_and_tenant_scoped() -> None:
    a = call_id(tool_id="x", tool_version="1.0.0", parameters={"a": 1, "b": 2}, tenant_id="t")
    b = call_id(tool_id="x", tool_version="1.0.0", parameters={"b": 2, "a": 1}, tenant_id="t")
    assert a == b
    assert len(a) == 64
    assert a != call_id(
        tool_id="x", tool_version="1.0.0", parameters={"a": 1, "b": 2}, tenant_id="u"
    )
    assert a != call_id(
        tool_id="x", tool_version="1.0.1", parameters={"a": 1, "b": 2}, tenant_id="t"
    )


def test_tools_with_credentials_cannot_be_cached() -> None:
    with pytest.raises(RegistrationError, match="cached"):

        @tool(
            id="unit__c",
            version="1.0.0",
            effect="read_only",
            redaction_allowlist=["attempt"],
            sandbox=Sandbox(permissions=ToolPermissions(credentials=["api_key"])),
            resilience=Resilience(cache=Cache()),
        )
        async def c(params: In, ctx: ToolContext) -> Out:
            raise NotImplementedError


@pytest.mark.parametrize(
    "make",
    [
        lambda: Retry(max_attempts=0),
        lambda: Retry(initial_backoff_s=2, max_backoff_s=1),
        lambda: Breaker(minimum_calls=30, window_size=20),
        lambda: Breaker(failure_rate=0),
        lambda: Breaker(open_s=0),
        lambda: Cache(mode="ttl", ttl_s=0),
    ],
)
def test_bad_policies_are_refused(make: Any) -> None:
    with pytest.raises(RegistrationError):
        make()


def test_defaults() -> None:
    assert spec_of(retried).circuit_name == "unit__retry"
    assert spec_of(retried).cache is None
    policy = Breaker()
    assert (policy.window_size, policy.minimum_calls, policy.failure_rate) == (20, 5, 0.5)
    assert (policy.slow_call_s, policy.slow_call_rate, policy.open_s) == (10, 1.0, 30)
    assert policy.half_open_calls == 3
    assert Retry().max_attempts == 1
