"""Which checkpoints are micro (hot only), macro or named (durable too)."""

from __future__ import annotations

import pytest

from toolfleet.executor.checkpoints.schedule import CheckpointSchedule, is_durable

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def saved(schedule: CheckpointSchedule, name: str | None = None) -> str:
    kind = schedule.kind_of(name)
    schedule.record(kind)
    return kind


def test_first_is_macro_then_micro_until_the_interval_passed() -> None:
    clock = Clock()
    schedule = CheckpointSchedule(interval_s=30, clock=clock)
    assert saved(schedule) == "macro"
    clock.now += 10
    assert saved(schedule) == "micro"
    clock.now += 19.9
    assert saved(schedule) == "micro"
    clock.now += 0.1
    assert saved(schedule) == "macro"
    clock.now += 1
    assert saved(schedule) == "micro"


def test_a_named_checkpoint_is_durable_and_restarts_the_interval() -> None:
    clock = Clock()
    schedule = CheckpointSchedule(interval_s=30, clock=clock)
    assert saved(schedule, "fetched") == "named"
    clock.now += 20
    assert saved(schedule) == "micro"
    assert saved(schedule, "parsed") == "named"
    clock.now += 29
    assert saved(schedule) == "micro"
    clock.now += 1
    assert saved(schedule) == "macro"


def test_interval_zero_makes_every_checkpoint_durable() -> None:
    schedule = CheckpointSchedule(interval_s=0, clock=Clock())
    assert [saved(schedule) for _ in range(3)] == ["macro", "macro", "macro"]


def test_an_unsaved_checkpoint_does_not_count() -> None:
    clock = Clock()
    schedule = CheckpointSchedule(interval_s=30, clock=clock)
    assert schedule.kind_of(None) == "macro"  # its save failed: nothing recorded
    clock.now += 1
    assert schedule.kind_of(None) == "macro"


def test_durable_kinds() -> None:
    assert [is_durable(k) for k in ("micro", "macro", "named")] == [False, True, True]
