"""When a circuit entered its current state: recorded for every state, closed included."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from toolfleet.api.console.routes import _circuit
from toolfleet.executor.circuits.breaker import (
    CallOutcome,
    CircuitBreaker,
    CircuitState,
    CircuitStatus,
    Verdict,
)
from toolfleet.tools.resilience import Breaker

pytestmark = pytest.mark.unit

POLICY = Breaker(
    window_size=4, minimum_calls=3, failure_rate=0.5, slow_call_s=1, open_s=10, half_open_calls=1
)
OK = CallOutcome(verdict=Verdict.SUCCESS, duration_s=0.1)
FAIL = CallOutcome(verdict=Verdict.FAILURE, duration_s=0.1)


class Store:
    def __init__(self, raw: str = "") -> None:
        self.raw = raw

    async def load(self, name: str) -> str:
        return self.raw

    async def swap(self, name: str, expected: str, new: str, transition: str) -> bool:
        if self.raw != expected:
            return False
        self.raw = new
        return True


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _since(store: Store) -> datetime | None:
    return _circuit("c", store.raw).since


async def test_since_is_first_seen_then_each_transition_closed_after_trials_included() -> None:
    store, clock = Store(), Clock(1000.0)
    breaker = CircuitBreaker(store=store, clock=clock)
    await breaker.before_call("c", POLICY)
    await breaker.after_call("c", POLICY, OK)
    assert _since(store) == datetime.fromtimestamp(1000.0, UTC)  # first seen
    clock.now = 1005.0
    await breaker.after_call("c", POLICY, OK)
    assert _since(store) == datetime.fromtimestamp(1000.0, UTC)  # still closed since then
    clock.now = 1010.0
    for _ in range(3):
        await breaker.after_call("c", POLICY, FAIL)
    assert CircuitState.from_json(store.raw).status is CircuitStatus.OPEN
    assert _since(store) == datetime.fromtimestamp(1010.0, UTC)
    clock.now = 1030.0
    assert (await breaker.before_call("c", POLICY)).allowed  # half-open trial
    assert _since(store) == datetime.fromtimestamp(1030.0, UTC)
    clock.now = 1031.0
    await breaker.after_call("c", POLICY, OK)
    state = CircuitState.from_json(store.raw)
    assert state.status is CircuitStatus.CLOSED
    assert _since(store) == datetime.fromtimestamp(1031.0, UTC)
    assert _circuit("c", store.raw).state == "closed"


async def test_a_state_stored_without_since_reads_as_unknown_then_starts_at_its_next_call() -> None:
    old = '{"status":"closed","window":[0],"trials_started":0,"trials_succeeded":0}'
    assert CircuitState.from_json(old).since == 0.0  # no KeyError
    assert _circuit("c", old).since is None  # unknown, not a crash
    assert _circuit("c", '{"status":"closed","since":0,"window":[]}').since is None
    store = Store(old)
    breaker = CircuitBreaker(store=store, clock=Clock(2000.0))
    await breaker.after_call("c", POLICY, OK)
    assert _since(store) == datetime.fromtimestamp(2000.0, UTC)
    assert CircuitState.from_json(store.raw).window == (0, 0)


def test_garbage_state_reads_as_unknown() -> None:
    assert _circuit("c", "not json").state == "unknown"
    assert _circuit("c", '{"status":"open","since":"x"}').since is None
