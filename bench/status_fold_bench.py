"""What folding one lifecycle event into an invocation row costs the status worker.

    python bench/status_fold_bench.py [--n 5000] [--repeat 7] [--parameters FILE.json]
                                      [--against REV ...]

In-process, no I/O: ``fact_of`` + ``apply`` (what ``StatusProjector.on_event`` and its
transition run per event) for each event type of a realistic lifecycle, the events
round-tripped through the Kafka codec first so ``data`` is what the worker decodes.
The live ``projection.py`` is timed against the same file at each ``--against`` git
revision (default: ``3669a25``, before the fold had a fast path, and ``172ff4b``, with
its hand-written fast readers), loaded from git into this process; all are timed in
turns, so a busy machine slows them alike.
Prints the best of ``--repeat`` runs in µs per event, per type and for the whole
lifecycle. The parameters default to the e2e benchmark's (``{"message": "hello"}``);
sanitizing them is the same code in every version.

Measured on the 2-core dev container (load ~1), µs per event, mean of the nine types,
best of 7 x 5000: 3669a25 (pydantic per event, ``dataclasses.replace`` per merge) 70;
172ff4b (hand-written fast readers) 18.6; live (one pydantic reader per type, fact and
row built once, no hand-written validators) 16.4. Rerun rather than trust these.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.lifecycle import T0, Lifecycle

from toolfleet.events import codec
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import InvocationStatus
from toolfleet.status import projection as live

ROOT = Path(__file__).resolve().parent.parent
NOW = T0
PARAMETERS: dict[str, Any] = {"message": "hello"}
SOURCE = "services/toolfleet/status/projection.py"


def at_revision(rev: str) -> ModuleType:
    """``projection.py`` as it is at git revision ``rev``, imported under its own name."""
    source = subprocess.run(
        ["git", "show", f"{rev}:{SOURCE}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    name = f"_projection_at_{rev.replace('-', '_').replace('/', '_')}"
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while building
    spec.loader.exec_module(module)
    return module


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
    parser.add_argument("--against", nargs="*", default=["3669a25", "172ff4b"])
    args = parser.parse_args()
    parameters = json.loads(args.parameters.read_text()) if args.parameters else PARAMETERS
    events = lifecycle(parameters)
    names = [*args.against, "live"]
    modules = [*(at_revision(rev) for rev in args.against), live]
    rows = [_rows_before(m, events) for m in modules]

    print(f"{'µs per event':<20}" + "".join(f"{n:>10}" for n in names))
    totals = [0.0] * len(modules)
    for index, (name, event) in enumerate(events):
        runs = [_fold(m, event, rows[i][index]) for i, m in enumerate(modules)]
        best = [float("inf")] * len(modules)
        for _ in range(args.repeat):
            for i, run in enumerate(runs):
                best[i] = min(best[i], _seconds(run, args.n))
        us = [b / args.n * 1e6 for b in best]
        totals = [t + u for t, u in zip(totals, us, strict=True)]
        print(f"{name:<20}" + "".join(f"{u:>10.2f}" for u in us))
    mean = [t / len(events) for t in totals]
    print(f"{'mean per event':<20}" + "".join(f"{m:>10.2f}" for m in mean))
    print(f"{'live speed-up':<20}" + "".join(f"{m / mean[-1]:>9.2f}x" for m in mean))


if __name__ == "__main__":
    main()
