"""The circuit breaker state machine, and the breaker's compare-and-swap over a store."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolfleet.errors import RegistrationError
from toolfleet.executor.circuits.breaker import (
    CallOutcome,
    CircuitBreaker,
    CircuitState,
    CircuitStatus,
    Step,
    Verdict,
    admit,
    record,
)
from toolfleet.tools.resilience import Breaker

pytestmark = pytest.mark.unit

POLICY = Breaker(
    window_size=4, minimum_calls=3, failure_rate=0.5, slow_call_s=1, open_s=10, half_open_calls=2
)
OK = CallOutcome(verdict=Verdict.SUCCESS, duration_s=0.1)
FAIL = CallOutcome(verdict=Verdict.FAILURE, duration_s=0.1)
SLOW = CallOutcome(verdict=Verdict.SUCCESS, duration_s=5)
IGNORED = CallOutcome(verdict=Verdict.IGNORED, duration_s=0.1)

outcomes = st.sampled_from([OK, FAIL, SLOW, IGNORED])


def opened() -> CircuitState:
    return CircuitState(status=CircuitStatus.OPEN, since=100.0)


@given(st.lists(outcomes, max_size=40))
def test_invariants_hold_for_any_sequence(calls: list[CallOutcome]) -> None:
    state = CircuitState()
    for i, outcome in enumerate(calls):
        now = float(i)
        step = admit("c", state, POLICY, now)
        state = step.state
        if step.allowed:
            state = record("c", state, POLICY, now, outcome).state
        assert len(state.window) <= POLICY.window_size
        assert 0 <= state.trials_succeeded <= state.trials_started <= POLICY.half_open_calls
        assert CircuitState.from_json(state.to_json()) == state


@given(st.lists(st.sampled_from([OK, FAIL, SLOW]), max_size=POLICY.minimum_calls - 1))
def test_never_opens_below_minimum_calls(calls: list[CallOutcome]) -> None:
    state = CircuitState()
    for outcome in calls:
        state = record("c", state, POLICY, 0, outcome).state
    assert state.status is CircuitStatus.CLOSED


@given(st.lists(st.sampled_from([OK, FAIL]), min_size=POLICY.minimum_calls, max_size=20))
def test_opens_exactly_when_the_failure_rate_is_reached(calls: list[CallOutcome]) -> None:
    state = CircuitState()
    for i, outcome in enumerate(calls):
        before = state
        step = record("c", state, POLICY, 0, outcome)
        state = step.state
        if state.status is CircuitStatus.OPEN:
            window = (*before.window, 1 if outcome is FAIL else 0)[-POLICY.window_size :]
            assert len(window) >= POLICY.minimum_calls
            assert sum(window) / len(window) >= POLICY.failure_rate
            assert step.transition is not None
            assert step.transition.retry_after_s == POLICY.open_s
            return
        window = state.window
        if len(window) >= POLICY.minimum_calls:
            assert sum(window) / len(window) < POLICY.failure_rate, i


def test_slow_calls_count_against_the_slow_call_rate() -> None:
    state = CircuitState()
    for _ in range(3):
        state = record("c", state, POLICY, 0, SLOW).state
    assert state.status is CircuitStatus.OPEN


def test_open_refuses_with_the_time_left_then_lets_a_trial_through() -> None:
    step = admit("c", opened(), POLICY, 104)
    assert (step.allowed, step.retry_after_s) == (False, 6)
    trial = admit("c", opened(), POLICY, 110)
    assert trial.allowed
    assert trial.state.status is CircuitStatus.HALF_OPEN
    assert trial.transition is not None
    assert trial.transition.status is CircuitStatus.HALF_OPEN


def test_half_open_permits_only_its_trials() -> None:
    state = admit("c", opened(), POLICY, 110).state
    state = admit("c", state, POLICY, 110).state
    refused = admit("c", state, POLICY, 111)
    assert not refused.allowed
    assert refused.retry_after_s > 0
    stale = admit("c", state, POLICY, 110 + POLICY.open_s + POLICY.slow_call_s)
    assert stale.allowed  # trials whose executor died are handed out again


def test_all_trials_succeeding_close_it() -> None:
    state = admit("c", opened(), POLICY, 110).state
    state = admit("c", state, POLICY, 110).state
    state = record("c", state, POLICY, 111, OK).state
    assert state.status is CircuitStatus.HALF_OPEN
    step = record("c", state, POLICY, 111, OK)
    assert step.state.status is CircuitStatus.CLOSED
    assert step.state.window == ()
    assert step.transition is not None
    assert step.transition.status is CircuitStatus.CLOSED


@pytest.mark.parametrize("outcome", [FAIL, SLOW])
def test_any_failed_trial_reopens_it(outcome: CallOutcome) -> None:
    state = admit("c", opened(), POLICY, 110).state
    step = record("c", state, POLICY, 111, outcome)
    assert step.state.status is CircuitStatus.OPEN
    assert step.state.since == 111


def test_ignored_trial_gives_its_permit_back() -> None:
    state = admit("c", opened(), POLICY, 110).state
    assert record("c", state, POLICY, 111, IGNORED).state.trials_started == 0


class MemoryStore:
    """A CircuitStore whose first swap loses a race once."""

    def __init__(self) -> None:
        self.raw = ""
        self.published: list[str] = []
        self.race_once = True

    async def load(self, name: str) -> str:
        return self.raw

    async def swap(self, name: str, expected: str, new: str, transition: str) -> bool:
        if self.race_once:
            self.race_once = False
            self.raw = CircuitState(window=(0,)).to_json()  # another executor wrote first
            return False
        if self.raw != expected:
            return False
        self.raw = new
        if transition:
            self.published.append(transition)
        return True


async def test_breaker_retries_a_lost_swap_and_publishes_transitions() -> None:
    store = MemoryStore()
    breaker = CircuitBreaker(store=store, clock=lambda: 50.0)
    # The racing write put one success in the window: two failures make 2 of 3.
    for _ in range(2):
        assert (await breaker.before_call("c", POLICY)).allowed
        await breaker.after_call("c", POLICY, FAIL)
    assert not (await breaker.before_call("c", POLICY)).allowed
    state = CircuitState.from_json(store.raw)
    assert state.status is CircuitStatus.OPEN
    assert len(store.published) == 1
    assert '"open"' in store.published[0]
    peek = await breaker.peek("c", POLICY)
    assert (peek.allowed, peek.retry_after_s) == (False, 10)


TIMED = Breaker(window="time", window_s=60, minimum_calls=3, failure_rate=0.5, slow_call_s=1)
CANARY = Breaker(open_s=10, slow_call_s=1, half_open_calls=3, half_open_strategy="canary")


@given(st.lists(st.tuples(outcomes, st.floats(0, 30)), max_size=40))
def test_time_window_invariants_hold_for_any_sequence(
    calls: list[tuple[CallOutcome, float]],
) -> None:
    state, now = CircuitState(), 0.0
    for outcome, gap in calls:
        now += gap
        step = admit("c", state, TIMED, now)
        state = step.state
        if step.allowed:
            state = record("c", state, TIMED, now, outcome).state
        assert len(state.times) == len(state.window)
        assert all(t <= now for t in state.times)
        if step.allowed and state.status is CircuitStatus.CLOSED and outcome is not IGNORED:
            assert all(now - TIMED.window_s < t for t in state.times)  # pruned
        assert CircuitState.from_json(state.to_json()) == state


def test_time_window_prunes_calls_older_than_window_s() -> None:
    state = CircuitState()
    for t, outcome in ((0, FAIL), (1, OK), (30, OK)):
        state = record("c", state, TIMED, t, outcome).state
    assert state.times == (0, 1, 30)
    state = record("c", state, TIMED, 60.5, OK).state
    assert state.times == (1, 30, 60.5)  # the call of t=0 left the window
    assert state.window == (0, 0, 0)
    state = record("c", state, TIMED, 95, OK).state
    assert state.times == (60.5, 95)
    assert state.window == (0, 0)


def test_time_window_opens_only_on_recent_failures() -> None:
    state = CircuitState()
    for t in (0, 30):  # two failures, below the minimum calls
        state = record("c", state, TIMED, t, FAIL).state
    assert state.status is CircuitStatus.CLOSED
    assert len(state.window) == 2
    # Two minutes later: the old failures are out; 2 successes and a failure don't trip it.
    for t, outcome in ((200, OK), (201, OK), (202, FAIL)):
        state = record("c", state, TIMED, t, outcome).state
        assert state.status is CircuitStatus.CLOSED
    assert state.times == (200, 201, 202)
    step = record("c", state, TIMED, 203, FAIL)  # 2 of 4 recent calls failed
    assert step.state.status is CircuitStatus.OPEN
    assert step.transition is not None
    assert step.transition.reason == "2 of the 4 calls of the last 60s failed"


def test_time_window_minimum_calls_counts_only_calls_in_the_window() -> None:
    state = CircuitState()
    for t in (0, 50, 100, 150):  # many failures, but never 3 within 60 s
        state = record("c", state, TIMED, t, FAIL).state
        assert state.status is CircuitStatus.CLOSED
        assert len(state.window) == 1 + (t > 0)


def test_time_window_keeps_at_most_its_cap() -> None:
    state = CircuitState()
    for i in range(TIMED.max_time_window_calls + 5):
        state = record("c", state, TIMED, i / 1000, OK).state
    assert len(state.window) == len(state.times) == TIMED.max_time_window_calls
    assert state.times[-1] == (TIMED.max_time_window_calls + 4) / 1000


def test_time_window_starts_afresh_from_a_count_window_state() -> None:
    state = CircuitState(window=(1, 1, 1, 1))  # written under a count window: no times
    state = record("c", state, TIMED, 10, FAIL).state
    assert (state.status, state.window, state.times) == (CircuitStatus.CLOSED, (1,), (10,))


def test_old_json_state_without_times_still_loads() -> None:
    old = '{"status":"closed","since":5.0,"window":[0,1,3],"trials_started":0,"trials_succeeded":0}'
    state = CircuitState.from_json(old)
    assert state == CircuitState(since=5.0, window=(0, 1, 3))
    assert state.to_json() == old  # count windows keep the old format
    timed = CircuitState(window=(1,), times=(7.5,), trial_at=3.0)
    assert CircuitState.from_json(timed.to_json()) == timed


def test_canary_admits_one_trial_at_a_time_and_closes_after_n_successes() -> None:
    state = admit("c", opened(), CANARY, 110).state
    assert state.status is CircuitStatus.HALF_OPEN
    for n in range(1, CANARY.half_open_calls):
        refused = admit("c", state, CANARY, 110 + n)  # the canary is still out
        assert not refused.allowed
        assert refused.retry_after_s > 0
        step = record("c", state, CANARY, 110 + n, OK)
        assert step.state.status is CircuitStatus.HALF_OPEN
        step = admit("c", step.state, CANARY, 110 + n)
        assert step.allowed
        state = step.state
        assert (state.trials_started, state.trials_succeeded) == (n + 1, n)
    step = record("c", state, CANARY, 120, OK)
    assert step.state.status is CircuitStatus.CLOSED
    assert step.transition is not None
    assert step.transition.reason == "3 half-open trial calls succeeded"


@pytest.mark.parametrize("outcome", [FAIL, SLOW])
def test_canary_failure_reopens_it(outcome: CallOutcome) -> None:
    state = admit("c", opened(), CANARY, 110).state
    state = admit("c", record("c", state, CANARY, 111, OK).state, CANARY, 111).state
    step = record("c", state, CANARY, 112, outcome)
    assert step.state == CircuitState(status=CircuitStatus.OPEN, since=112)


def test_canary_ignored_trial_lets_the_next_one_through() -> None:
    state = admit("c", opened(), CANARY, 110).state
    state = record("c", state, CANARY, 111, IGNORED).state
    assert admit("c", state, CANARY, 111).allowed


def test_a_stale_canary_is_handed_out_again() -> None:
    state = admit("c", opened(), CANARY, 110).state
    state = admit("c", record("c", state, CANARY, 130, OK).state, CANARY, 130).state
    # Stale counts from when this canary went out (130), not from entering half-open.
    stale_after = 130 + CANARY.open_s + CANARY.slow_call_s
    refused = admit("c", state, CANARY, stale_after - 1)
    assert (refused.allowed, refused.retry_after_s) == (False, 1)
    again = admit("c", state, CANARY, stale_after)
    assert again.allowed
    assert again.state.status is CircuitStatus.HALF_OPEN
    assert (again.state.trials_started, again.state.trials_succeeded) == (1, 0)


@given(st.lists(outcomes, max_size=40))
def test_canary_invariants_hold_for_any_sequence(calls: list[CallOutcome]) -> None:
    state = CircuitState(status=CircuitStatus.OPEN, since=0.0)
    for i, outcome in enumerate(calls):
        now = float(i * 5)
        step = admit("c", state, CANARY, now)
        state = step.state
        if step.allowed:
            state = record("c", state, CANARY, now, outcome).state
        if state.status is CircuitStatus.HALF_OPEN:
            assert state.trials_started - state.trials_succeeded in (0, 1)
            assert state.trials_succeeded < CANARY.half_open_calls
        assert CircuitState.from_json(state.to_json()) == state


@pytest.mark.parametrize(
    "make",
    [
        lambda: Breaker(window="time", window_s=0),
        lambda: Breaker(window="time", minimum_calls=1001),
        lambda: Breaker(window="sliding"),  # type: ignore[arg-type]
        lambda: Breaker(half_open_strategy="one_by_one"),  # type: ignore[arg-type]
    ],
)
def test_invalid_window_and_strategy_are_refused(make: Callable[[], Breaker]) -> None:
    with pytest.raises(RegistrationError):
        make()


def test_a_time_window_may_need_more_calls_than_window_size() -> None:
    assert Breaker(window="time", minimum_calls=50).minimum_calls == 50


class SharedStore(MemoryStore):
    """A CircuitStore as Redis is to many executors: every call is a round trip."""

    def __init__(self) -> None:
        super().__init__()
        self.race_once = False
        self.swaps = 0

    async def load(self, name: str) -> str:
        await asyncio.sleep(0)  # the reply arrives on a later turn of the loop
        return await super().load(name)

    async def swap(self, name: str, expected: str, new: str, transition: str) -> bool:
        await asyncio.sleep(0)
        self.swaps += 1
        return await super().swap(name, expected, new, transition)


@given(st.lists(outcomes, min_size=1, max_size=60))
def test_calls_finishing_together_are_recorded_as_one_by_one_in_fewer_writes(
    finished: list[CallOutcome],
) -> None:
    async def record_all() -> tuple[SharedStore, list[Step]]:
        store = SharedStore()
        breaker = CircuitBreaker(store=store, clock=lambda: 50.0)
        steps = await asyncio.gather(*(breaker.after_call("c", POLICY, o) for o in finished))
        return store, steps

    store, steps = asyncio.run(record_all())

    expected, transitions = CircuitState(), []
    for outcome in finished:
        step = record("c", expected, POLICY, 50.0, outcome)
        expected = step.state
        transitions += [step.transition] if step.transition else []
    final = CircuitState.from_json(store.raw) if store.raw else CircuitState()
    assert final == expected
    # Each transition published once, and reported to the one call that caused it.
    assert [s.transition for s in steps if s.transition] == transitions
    assert len(store.published) == len(transitions)
    assert store.swaps <= len(transitions) + 1  # not one write per call


class CountingStore(SharedStore):
    """A SharedStore that counts reads, and that another executor may write to."""

    def __init__(self) -> None:
        super().__init__()
        self.loads = 0

    async def load(self, name: str) -> str:
        self.loads += 1
        return await super().load(name)

    def written_elsewhere(self, state: CircuitState) -> None:
        self.raw = state.to_json()


async def test_a_call_reads_its_circuit_once_and_records_in_one_write() -> None:
    store = CountingStore()
    breaker = CircuitBreaker(store=store, clock=lambda: 50.0)
    for call in range(3):
        peeked = await breaker.peek("c", POLICY)  # admission's gate: a fresh read
        step = await breaker.before_call("c", POLICY, read=peeked.read)
        assert step.allowed
        await breaker.after_call("c", POLICY, OK)  # swapped against what this process wrote
        assert (store.loads, store.swaps) == (call + 1, call + 1)
    assert CircuitState.from_json(store.raw).window == (0, 0, 0)


async def test_a_record_after_another_executor_s_write_reads_again_and_keeps_both() -> None:
    store = CountingStore()
    breaker = CircuitBreaker(store=store, clock=lambda: 50.0)
    await breaker.after_call("c", POLICY, OK)
    store.written_elsewhere(CircuitState(window=(0, 0)))  # another executor recorded two
    await breaker.after_call("c", POLICY, FAIL)  # its swap fails; it reads and records
    assert CircuitState.from_json(store.raw).window == (0, 0, 1)
    # Nothing to write, judged on a state this process wrote: read before believing it.
    store.written_elsewhere(CircuitState(status=CircuitStatus.OPEN, since=49.0))
    loads = store.loads
    await breaker.after_call("c", POLICY, IGNORED)
    assert store.loads == loads + 1


async def test_a_check_without_a_fresh_read_reads_the_circuit_opened_elsewhere() -> None:
    store = CountingStore()
    breaker = CircuitBreaker(store=store, clock=lambda: 50.0)
    await breaker.after_call("c", POLICY, OK)
    store.written_elsewhere(CircuitState(status=CircuitStatus.OPEN, since=49.0))
    assert not (await breaker.before_call("c", POLICY)).allowed  # a retry's check: reads
