"""What building one audit event costs, per lifecycle type (not part of ``make bench``).

    python bench/audit_record_bench.py [--n 5000] [--profile TYPE]

In-process, no I/O: :func:`toolfleet.audit.records.audit_event` on realistic events of
every lifecycle type, each as the audit worker decodes it from the wire (binary mode).
Prints CPU microseconds per event (process time, best of ``--repeat`` runs, so other
load on the machine shows less) and the mean over all types;
``--profile requested`` prints a cProfile of that type instead.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.audit_golden import wire
from tests.support.lifecycle import Lifecycle

from toolfleet.audit.records import audit_event
from toolfleet.errors import ErrorCode
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import InvocationStatus

NOW = datetime(2025, 1, 1, 13, 0, tzinfo=UTC)
TOPIC = "toolfleet.invoke.events"
PARAMETERS = {
    "query": "weather in Lyon for the next 3 days",
    "units": "metric",
    "limit": 10,
    "options": {"lang": "fr", "include_alerts": True},
}


def events() -> dict[str, Envelope]:
    lc = Lifecycle(parameters=PARAMETERS)
    built = {
        "requested": lc.requested(),
        "authorized": lc.authorized(),
        "approval.requested": lc.approval_requested(),
        "approval.granted": lc.approval(granted=True),
        "invoked": lc.invoked(),
        "checkpoint": lc.checkpoint(40, "fetching"),
        "executed": lc.executed(),
        "succeeded": lc.outcome(),
        "failed": lc.outcome(InvocationStatus.ERROR),
        "timeout": lc.outcome(InvocationStatus.TIMEOUT, code=ErrorCode.TIMEOUT),
        "cancel.requested": lc.cancel_requested(),
    }
    return {name: wire(event) for name, event in built.items()}


def per_event_us(event: Envelope, n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        for _ in range(n):
            audit_event(event, topic=TOPIC, now=NOW)
        best = min(best, time.process_time() - started)
    return best / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", metavar="TYPE", help="cProfile one type instead")
    args = parser.parse_args()
    cases = events()
    if args.profile:
        event = cases[args.profile]
        with cProfile.Profile() as profile:
            for _ in range(args.n):
                audit_event(event, topic=TOPIC, now=NOW)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    timings = {name: per_event_us(event, args.n, args.repeat) for name, event in cases.items()}
    for name, us in timings.items():
        print(f"{name:<20} {us:8.1f} µs/event")
    print(f"{'mean':<20} {sum(timings.values()) / len(timings):8.1f} µs/event")


if __name__ == "__main__":
    main()
