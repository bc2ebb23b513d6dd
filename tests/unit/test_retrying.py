"""Retry until stopped: what is tried again, how long it pauses, and what ends it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import pytest

from toolfleet.storage.retrying import Backoff, UntilStopped, retry_until_stopped

pytestmark = pytest.mark.unit


class FakeTime:
    """A clock that a pause moves forward: no test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def failing(
    times: int, error: Exception, result: str = "done"
) -> tuple[list[int], Callable[[], Awaitable[str]]]:
    calls: list[int] = []

    async def step() -> str:
        calls.append(1)
        if len(calls) <= times:
            raise error
        return result

    return calls, step


def top(low: float, high: float) -> float:
    """Jitter pinned to the ceiling, so pauses can be asserted exactly."""
    return high


async def test_named_failures_are_retried_with_doubling_pauses_up_to_the_ceiling() -> None:
    time = FakeTime()
    calls, step = failing(5, ConnectionError("refused"))
    policy: UntilStopped[str] = UntilStopped(
        what="reconnecting",
        backoff=Backoff(first_s=0.1, max_s=0.5),
        retry_on=(ConnectionError,),
        sleep=time.sleep,
        clock=time.clock,
        jitter=top,
    )
    assert await policy.run(step) == "done"
    assert len(calls) == 6
    assert time.pauses == pytest.approx([0.1, 0.2, 0.4, 0.5, 0.5])


async def test_jitter_draws_each_pause_from_the_upper_half_of_its_ceiling() -> None:
    time = FakeTime()
    drawn: list[tuple[float, float]] = []

    def jitter(low: float, high: float) -> float:
        drawn.append((low, high))
        return low

    _, step = failing(2, TimeoutError())
    policy: UntilStopped[str] = UntilStopped(
        what="w",
        backoff=Backoff(first_s=0.2, max_s=5),
        retry_on=(TimeoutError,),
        sleep=time.sleep,
        jitter=jitter,
    )
    await policy.run(step)
    assert drawn == [(0.1, 0.2), (0.2, 0.4)]
    assert time.pauses == [0.1, 0.2]


async def test_an_error_it_does_not_name_is_raised_at_once() -> None:
    time = FakeTime()
    calls, step = failing(1, ValueError("bad"))
    with pytest.raises(ValueError, match="bad"):
        await retry_until_stopped(
            step,
            what="w",
            backoff=Backoff(first_s=0.1, max_s=1),
            retry_on=(ConnectionError,),
            sleep=time.sleep,
        )
    assert len(calls) == 1
    assert time.pauses == []


async def test_a_predicate_picks_what_is_retried() -> None:
    time = FakeTime()
    calls, step = failing(2, LookupError("404"))
    result = await retry_until_stopped(
        step,
        what="w",
        backoff=Backoff.listed((0.1, 0.2)),
        retry_on=lambda exc: isinstance(exc, LookupError) and str(exc) == "404",
        sleep=time.sleep,
    )
    assert result == "done"
    assert len(calls) == 3


async def test_running_out_of_tries_raises_the_last_error() -> None:
    time = FakeTime()
    calls, step = failing(10, ConnectionError())
    with pytest.raises(ConnectionError):
        await retry_until_stopped(
            step,
            what="w",
            backoff=Backoff.listed((0.1, 0.4, 1.0)),
            retry_on=(ConnectionError,),
            tries=4,
            sleep=time.sleep,
        )
    assert len(calls) == 4
    assert len(time.pauses) == 3
    assert all(0.05 <= p <= 0.1 for p in time.pauses[:1])
    assert 0.5 <= time.pauses[2] <= 1.0


async def test_patience_puts_the_last_try_at_the_deadline_then_raises() -> None:
    time = FakeTime()
    calls, step = failing(100, ConnectionError())
    with pytest.raises(ConnectionError):
        await retry_until_stopped(
            step,
            what="w",
            backoff=Backoff(first_s=1.0, max_s=1.0),
            retry_on=(ConnectionError,),
            patience_s=2.5,
            sleep=time.sleep,
            clock=time.clock,
        )
    assert time.now == pytest.approx(2.5)  # the last pause was cut to the deadline
    assert len(calls) == len(time.pauses) + 1


async def test_a_stop_set_beforehand_tries_nothing() -> None:
    stop = asyncio.Event()
    stop.set()
    calls, step = failing(0, ConnectionError())
    assert (
        await retry_until_stopped(step, what="w", backoff=Backoff(first_s=1, max_s=1), stop=stop)
        is None
    )
    assert calls == []


async def test_a_stop_ends_a_pause_at_once() -> None:
    stop = asyncio.Event()
    never = asyncio.Event()
    paused = asyncio.Event()

    async def sleep_forever(seconds: float) -> None:
        paused.set()
        await never.wait()

    calls, step = failing(100, ConnectionError())
    running = asyncio.create_task(
        retry_until_stopped(
            step,
            what="w",
            backoff=Backoff(first_s=60, max_s=60),
            retry_on=(ConnectionError,),
            stop=stop,
            sleep=sleep_forever,
        )
    )
    await asyncio.wait_for(paused.wait(), 5)
    stop.set()
    assert await asyncio.wait_for(running, 5) is None
    assert len(calls) == 1


async def test_a_cancel_ends_it_at_once_and_is_never_retried() -> None:
    calls: list[int] = []
    entered = asyncio.Event()

    async def step() -> None:
        calls.append(1)
        entered.set()
        await asyncio.Event().wait()

    time = FakeTime()
    running = asyncio.create_task(
        retry_until_stopped(
            step,
            what="w",
            backoff=Backoff(first_s=0.1, max_s=1),
            retry_on=lambda exc: True,
            sleep=time.sleep,
        )
    )
    await asyncio.wait_for(entered.wait(), 5)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert calls == [1]
    assert time.pauses == []


async def test_progress_starts_the_pauses_over() -> None:
    time = FakeTime()
    calls: list[int] = []
    policy: UntilStopped[str] = UntilStopped(
        what="w",
        backoff=Backoff(first_s=0.1, max_s=10),
        retry_on=(ConnectionError,),
        sleep=time.sleep,
        jitter=top,
    )

    async def step() -> str:
        calls.append(1)
        if len(calls) == 3:
            policy.made_progress()  # connected, then lost again
        if len(calls) < 5:
            raise ConnectionError
        return "done"

    assert await policy.run(step) == "done"
    assert time.pauses == pytest.approx([0.1, 0.2, 0.1, 0.2])


async def test_a_result_can_ask_for_another_try_until_give_up_says_stop() -> None:
    time = FakeTime()
    answers = iter([False, False, True])
    asked: list[int] = []

    async def take() -> bool:
        return next(answers)

    async def give_up() -> bool:
        asked.append(1)
        return False

    taken = await retry_until_stopped(
        take,
        what="w",
        backoff=Backoff(first_s=0.02, max_s=1),
        again=lambda ok: not ok,
        give_up=give_up,
        sleep=time.sleep,
    )
    assert taken is True
    assert len(asked) == 2

    async def never() -> bool:
        return False

    async def yes() -> bool:
        return True

    assert (
        await retry_until_stopped(
            never,
            what="w",
            backoff=Backoff(first_s=0.02, max_s=1),
            again=lambda ok: not ok,
            give_up=yes,
            sleep=time.sleep,
        )
        is None
    )


async def test_failures_are_logged_by_type_never_by_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time = FakeTime()
    _, step = failing(1, ConnectionError("redis://:hunter2@cache:6379"))
    with caplog.at_level(logging.WARNING, logger="toolfleet.storage.retrying"):
        await retry_until_stopped(
            step,
            what="subscription lost; reconnecting",
            backoff=Backoff(first_s=0.1, max_s=1),
            retry_on=(ConnectionError,),
            log_extra={"channel": "c"},
            sleep=time.sleep,
        )
    [record] = caplog.records
    assert record.getMessage() == "subscription lost; reconnecting"
    assert record.__dict__["error"] == "ConnectionError"
    assert record.__dict__["channel"] == "c"
    assert "hunter2" not in str(record.__dict__)


async def test_a_step_that_returns_an_awaitable_is_awaited() -> None:
    """A lambda over a coroutine (how call sites pass their step) is awaited, not returned."""
    time = FakeTime()
    calls, step = failing(1, ConnectionError())
    result = await retry_until_stopped(
        lambda: step(),
        what="w",
        backoff=Backoff(first_s=0.1, max_s=1),
        retry_on=(ConnectionError,),
        sleep=time.sleep,
    )
    assert result == "done"
    assert len(calls) == 2


async def test_each_try_is_judged_once_and_each_retried_failure_is_told() -> None:
    """The predicates may count or log: one question per try, the first one included."""
    time = FakeTime()
    judged: list[str] = []
    told: list[str] = []
    results = iter([ConnectionError("a"), "not yet", ConnectionError("b"), "done"])

    async def step() -> str:
        result = next(results)
        if isinstance(result, Exception):
            raise result
        return result

    def retried(exc: Exception) -> bool:
        judged.append(f"error {exc}")
        return True

    def again(result: str) -> bool:
        judged.append(f"result {result}")
        return result != "done"

    policy: UntilStopped[str] = UntilStopped(
        what="w",
        backoff=Backoff(first_s=0.1, max_s=1),
        retry_on=retried,
        again=again,
        after_failure=lambda exc: told.append(str(exc)),
        sleep=time.sleep,
        jitter=top,
    )
    assert await policy.run(step) == "done"
    assert judged == ["error a", "result not yet", "error b", "result done"]
    assert told == ["a", "b"]
    assert time.pauses == pytest.approx([0.1, 0.2, 0.4])


async def test_a_first_try_that_works_returns_at_once() -> None:
    time = FakeTime()
    calls, step = failing(0, ConnectionError())
    assert (
        await retry_until_stopped(
            step,
            what="w",
            backoff=Backoff(first_s=0.1, max_s=1),
            retry_on=(ConnectionError,),
            again=lambda result: result != "done",
            sleep=time.sleep,
        )
        == "done"
    )
    assert calls == [1]
    assert time.pauses == []
