"""What folding one lifecycle event into an invocation row costs the status worker.

    python bench/status_fold_bench.py [--n 5000] [--repeat 7] [--parameters FILE.json]

In-process, no I/O: ``fact_of`` + ``apply`` (what ``StatusProjector.on_event`` and its
transition run per event) for each event type of a realistic lifecycle, the events
round-tripped through the Kafka codec first so ``data`` is what the worker decodes.
``before`` is the fold as it was before its fast path (kept verbatim as the golden
test's oracle, ``tests/support/projection_reference.py``), ``after`` the live one; both
are timed in turns in the same process, so a busy machine slows both alike. Prints
the best of ``--repeat`` runs in µs per event, per type and for the whole lifecycle.
The parameters default to the e2e benchmark's (``{"message": "hello"}``); sanitizing
them is the same code before and after.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import projection_reference as before_module
from tests.support.lifecycle import T0, Lifecycle

from toolfleet.events import codec
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import InvocationStatus
from toolfleet.status import projection as after_module

NOW = T0
PARAMETERS: dict[str, Any] = {"message": "hello"}


def _wire(event: Envelope) -> Envelope:
    message = codec.encode(event)
    return codec.decode(key=message.key, value=message.value, headers=message.headers)


def lifecycle(parameters: dict[str, Any]) -> list[tuple[str, Envelope]]:
    lc = Lifecycle(parameters=parameters)
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


def _seconds(run: Callable[[], object], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        run()
    return time.perf_counter() - started


def _fold(module: ModuleType, event: Envelope, before: Any) -> Callable[[], object]:
    fact_of, apply = module.fact_of, module.apply
    now = NOW

    def run() -> object:
        return apply(before, fact_of(event, now=now))

    return run


def _rows_before(module: ModuleType, events: list[tuple[str, Envelope]]) -> list[Any]:
    """The row each event folds into: the one the events before it (in order) built."""
    rows: list[Any] = []
    row = None
    for _, event in events:
        rows.append(row)
        row = module.apply(row, module.fact_of(event, now=NOW))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--parameters", type=Path, help="a JSON object of tool parameters")
    args = parser.parse_args()
    parameters = json.loads(args.parameters.read_text()) if args.parameters else PARAMETERS
    events = lifecycle(parameters)
    modules = (before_module, after_module)
    rows = [_rows_before(m, events) for m in modules]

    print(f"{'fact_of+apply':<20} {'before µs':>10} {'after µs':>10} {'speed-up':>9}")
    totals = [0.0, 0.0]
    for index, (name, event) in enumerate(events):
        runs = [_fold(m, event, rows[i][index]) for i, m in enumerate(modules)]
        best = [float("inf"), float("inf")]
        for _ in range(args.repeat):
            for i, run in enumerate(runs):
                best[i] = min(best[i], _seconds(run, args.n))
        us = [b / args.n * 1e6 for b in best]
        totals = [t + u for t, u in zip(totals, us, strict=True)]
        print(f"{name:<20} {us[0]:>10.2f} {us[1]:>10.2f} {us[0] / us[1]:>8.2f}x")
    mean = [t / len(events) for t in totals]
    print(f"{'mean per event':<20} {mean[0]:>10.2f} {mean[1]:>10.2f} {mean[0] / mean[1]:>8.2f}x")


if __name__ == "__main__":
    main()
