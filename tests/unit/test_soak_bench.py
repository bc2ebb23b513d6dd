"""The soak bench: each stage runs for the calls asked, and what counts as holding."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from soak_bench import STAGES, Soak

pytestmark = pytest.mark.unit


def calls_run(name: str, calls: int) -> int:
    argv = STAGES[name].argv(calls)
    value = dict(zip(argv[1::2], argv[2::2], strict=False))
    if name == "audit":  # eleven lifecycle types, n each per repeat; five events a call
        return int(value["--n"]) * 11 * int(value["--repeat"]) // 5
    per_run = int(value.get("--n", value.get("--calls", "0")))
    return per_run * int(value.get("--rounds", value.get("--repeat", "1")))


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_stage_runs_about_the_calls_asked_for(name: str) -> None:
    assert calls_run(name, 100_000) == pytest.approx(100_000, rel=0.01)
    assert calls_run(name, 2_500) == pytest.approx(2_500, rel=0.01)


def test_status_keeps_one_projector_for_the_whole_run() -> None:
    assert "--one-database" in STAGES["status"].argv(100_000)


def soaked(*, largest: float = 100.0, end: float = 101.0, exit_code: int = 0) -> Soak:
    return Soak("policy", 40.0, warm_mb=98.0, largest_mb=largest, end_mb=end, exit_code=exit_code)


def test_a_stage_holds_under_the_goal_and_without_growth() -> None:
    assert soaked(end=103.0).holds(growth_mb=5.0)  # warm at 98 MB: grew 5
    assert not soaked(end=103.5).holds(growth_mb=5.0)
    assert not soaked(largest=150.0).holds(growth_mb=5.0)
    assert not soaked(exit_code=1).holds(growth_mb=5.0)
