"""Does a worker's own code hold its memory over 100k calls? (not part of ``make bench``).

    python bench/soak_bench.py [--calls 100000] [--stages runtime,policy,executor,audit,status]

The issue's memory goal is a worker's RSS after 100,000 invocations through the whole
fleet; the dev broker cannot carry that run (memory-only, no retention and no
``DeleteRecords``: it slows as it fills, see ``bench/PROFILE.md``), and no production
broker runs on this machine. This runs, instead, each stage's in-process bench for
``--calls`` calls in one process, the service objects living across the whole run as
in a worker (caches, pools, pipelines, clients; real Redis and Postgres): the consumer
runtime per record (``runtime_record_bench.py``), policy (``policy_call_bench.py``),
the executor (``executor_call_bench.py``), audit's record building
(``audit_record_bench.py``, five events per call) and status's projection into Postgres
(``status_store_bench.py``). What it leaves out is aiokafka's consumer and producer.

Samples each process's RSS every ``--every`` seconds (``/proc`` through psutil) and
prints, per stage, the RSS once a fifth of the run is done (warm), at most afterwards and
at the end, and the growth from warm to the end. A stage holds when its largest RSS is
under 150 MB and it grew by at most ``--growth-mb`` after warm-up.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil  # type: ignore[import-untyped]

from probes import RSS_GOAL_MB

HERE = Path(__file__).resolve().parent
WARM_FRACTION = 0.2
"""The share of a stage's run after which it counts as warm (imports, the first round)."""


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    argv: Callable[[int], list[str]]
    """The bench's arguments for ``calls`` calls (rounded to whole rounds)."""


def _rounds(calls: int, per_round: int = 1_000) -> tuple[int, int]:
    rounds = max(1, round(calls / per_round))
    return max(1, calls // rounds), rounds


def _runtime(calls: int) -> list[str]:
    n, rounds = _rounds(calls)
    return ["runtime_record_bench.py", "--n", str(n), "--rounds", str(rounds)]


def _policy(calls: int) -> list[str]:
    n, rounds = _rounds(calls)
    return ["policy_call_bench.py", "--n", str(n), "--rounds", str(rounds), "--scenario", "e2e"]


def _executor(calls: int) -> list[str]:
    n, rounds = _rounds(calls)
    return ["executor_call_bench.py", "--n", str(n), "--repeat", str(rounds), "--warmup", "500"]


def _audit(calls: int) -> list[str]:
    # It builds each of its eleven lifecycle types n times per repeat; a call is five events.
    repeat = 5
    return ["audit_record_bench.py", "--n", str(max(1, calls * 5 // 11 // repeat)),
            "--repeat", str(repeat)]  # fmt: skip


def _status(calls: int) -> list[str]:
    n, rounds = _rounds(calls)
    return ["status_store_bench.py", "--calls", str(n), "--repeat", str(rounds), "--one-database"]


STAGES = {
    stage.name: stage
    for stage in (
        Stage("runtime", _runtime),
        Stage("policy", _policy),
        Stage("executor", _executor),
        Stage("audit", _audit),
        Stage("status", _status),
    )
}


@dataclass(frozen=True, slots=True)
class Soak:
    stage: str
    seconds: float
    warm_mb: float
    largest_mb: float
    end_mb: float
    exit_code: int
    trend_mb: tuple[float, ...] = ()
    """RSS at each fifth of the run: a steady climb or a plateau."""

    def holds(self, growth_mb: float) -> bool:
        return (
            self.exit_code == 0
            and self.largest_mb < RSS_GOAL_MB
            and self.end_mb - self.warm_mb <= growth_mb
        )


def soak(stage: Stage, calls: int, every_s: float) -> Soak:
    """Run ``stage`` for ``calls`` calls in a child process, sampling its RSS."""
    script, *options = stage.argv(calls)
    argv = [sys.executable, str(HERE / script), *options]
    started = time.monotonic()
    samples: list[tuple[float, float]] = []
    with subprocess.Popen(argv, cwd=HERE, stdout=subprocess.DEVNULL) as child:
        process = psutil.Process(child.pid)
        while child.poll() is None:
            try:
                rss = process.memory_info().rss / 2**20
            except psutil.NoSuchProcess:
                break
            samples.append((time.monotonic() - started, rss))
            time.sleep(every_s)
    seconds = time.monotonic() - started
    if not samples:
        return Soak(stage.name, seconds, 0.0, 0.0, 0.0, child.returncode)
    warm = [rss for at, rss in samples if at >= seconds * WARM_FRACTION] or [samples[-1][1]]
    trend = tuple(
        next((rss for at, rss in samples if at >= seconds * k / 5), samples[-1][1])
        for k in range(1, 6)
    )
    return Soak(stage.name, seconds, warm[0], max(warm), samples[-1][1], child.returncode, trend)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--every", type=float, default=0.25, help="seconds between samples")
    parser.add_argument("--growth-mb", type=float, default=5.0)
    args = parser.parse_args()
    names = [name.strip() for name in args.stages.split(",") if name.strip()]
    unknown = sorted(set(names) - set(STAGES))
    if unknown:
        parser.error(f"unknown stages {unknown}; known: {', '.join(STAGES)}")
    os.environ.setdefault("TOOLFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")
    print(f"{'stage':<9} {'calls':>8} {'s':>6} {'warm MB':>8} {'max MB':>7} {'end MB':>7} "
          f"{'growth':>7}  {'by fifths (MB)':<30} verdict")  # fmt: skip
    failed = False
    for name in names:
        result = soak(STAGES[name], args.calls, args.every)
        holds = result.holds(args.growth_mb)
        failed |= not holds
        verdict = "holds" if holds else f"DOES NOT HOLD (exit {result.exit_code})"
        print(f"{name:<9} {args.calls:>8,} {result.seconds:>6.0f} {result.warm_mb:>8.1f} "
              f"{result.largest_mb:>7.1f} {result.end_mb:>7.1f} "
              f"{result.end_mb - result.warm_mb:>+7.1f}  "
              f"{' '.join(f'{mb:.0f}' for mb in result.trend_mb):<30} {verdict}",
              flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
