"""What folding one lifecycle event into an invocation row costs the status worker.

    python bench/status_fold_bench.py [--n 20000] [--repeat 5]

In-process, no I/O: ``fact_of`` + ``apply`` (what ``StatusProjector.on_event`` and its
transition run per event) for each event type of a realistic lifecycle, the events
round-tripped through the Kafka codec first so ``data`` is what the worker decodes.
Prints the best of ``--repeat`` runs in µs per event, per type and for the whole
lifecycle (``fact_of`` alone beside it).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.lifecycle import Lifecycle

from toolfleet.events import codec
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import InvocationStatus
from toolfleet.status.projection import InvocationRow, apply, fact_of

NOW = Lifecycle().requested().time
PARAMETERS = {
    "query": "quarterly revenue by region",
    "limit": 25,
    "filters": {"region": ["emea", "apac"], "since": "2025-01-01"},
    "include_drafts": False,
}


def _wire(event: Envelope) -> Envelope:
    message = codec.encode(event)
    return codec.decode(key=message.key, value=message.value, headers=message.headers)


def lifecycle() -> list[tuple[str, Envelope]]:
    lc = Lifecycle(parameters=PARAMETERS)
    events = [
        ("requested", lc.requested(at=0)),
        ("authorized", lc.authorized(at=1)),
        ("approval_requested", lc.approval_requested(at=1.5)),
        ("approval_granted", lc.approval(granted=True, at=1.7)),
        ("invoked", lc.invoked(at=2)),
        ("checkpoint", lc.checkpoint(40, "fetching", at=3)),
        ("executed", lc.executed(at=5)),
        ("cancel_requested", lc.cancel_requested(at=5.5)),
        ("succeeded", lc.outcome(InvocationStatus.SUCCESS, at=6)),
    ]
    return [(name, _wire(event)) for name, event in events]


def _best_us(run: Callable[[], object], n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(n):
            run()
        best = min(best, time.perf_counter() - started)
    return best / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    assert NOW is not None
    now = NOW
    events = lifecycle()
    # The row each event folds into: the one the events before it (in order) built.
    rows: list[InvocationRow | None] = []
    row: InvocationRow | None = None
    for _, event in events:
        rows.append(row)
        fact = fact_of(event, now=now)
        assert fact is not None
        row = apply(row, fact)

    print(f"{'event':<20} {'fact_of µs':>11} {'fact_of+apply µs':>17}")
    total_fact = total_fold = 0.0
    for (name, event), before in zip(events, rows, strict=True):

        def fact(event: Envelope = event) -> object:
            return fact_of(event, now=now)

        def fold(event: Envelope = event, before: InvocationRow | None = before) -> object:
            f = fact_of(event, now=now)
            assert f is not None
            return apply(before, f)

        fact_us = _best_us(fact, args.n, args.repeat)
        fold_us = _best_us(fold, args.n, args.repeat)
        total_fact += fact_us
        total_fold += fold_us
        print(f"{name:<20} {fact_us:>11.2f} {fold_us:>17.2f}")
    count = len(events)
    print(f"{'mean per event':<20} {total_fact / count:>11.2f} {total_fold / count:>17.2f}")


if __name__ == "__main__":
    main()
