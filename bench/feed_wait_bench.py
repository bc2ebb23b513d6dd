"""What a projection notice costs the API while reads wait for calls to appear.

    python bench/feed_wait_bench.py [--waiting 10 200 2000] [--notices 1000]

In-process, no I/O: an :class:`~toolfleet.api.feed.InvocationFeed` with ``--waiting``
reads awaiting calls not yet projected, fed ``--notices`` notices of other calls in
batches of 50 (the projection commits events in batches), each batch delivered as the
feed's loop delivers it. The baseline is how those reads waited before: each held a
subscription to its tenant's rows (:meth:`~toolfleet.api.feed.InvocationFeed.subscribe`,
still what the console's live list uses), so every row read for a notice was offered to
every waiting read of its tenant, and drained there. Now each awaits its id
(:meth:`~toolfleet.api.feed.InvocationFeed.awaiting`): a notice wakes the reads of that
id only and the feed reads no row for them. The rows come from memory here; the feed's
Postgres read per batch, which the baseline also paid, is not counted.

Prints process CPU per notice, both ways, best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from toolfleet.api.feed import InvocationFeed
from toolfleet.contract.http import InvocationView

NOW = datetime(2026, 11, 30, tzinfo=UTC)
TENANTS = [f"t{i:02d}" for i in range(50)]
BATCH = 50


def _view(invocation_id: uuid.UUID, tenant_id: str) -> InvocationView:
    return InvocationView.model_validate(
        {
            "invocation_id": invocation_id,
            "tenant_id": tenant_id,
            "agent_did": "did:agent:bench",
            "tool_id": "core__echo",
            "status": "pending",
            "progress_percent": 0.0,
            "current_phase": "",
            "created_at": NOW,
            "updated_at": NOW,
        }
    )


async def _run(waiting: int, notices: int, *, by_id: bool) -> float:
    """CPU seconds per notice with ``waiting`` reads awaiting (by id, or subscribed)."""
    noticed = [uuid.uuid4() for _ in range(notices)]
    rows = {i: _view(i, TENANTS[n % len(TENANTS)]) for n, i in enumerate(noticed)}

    async def read_many(ids: Sequence[uuid.UUID]) -> list[InvocationView]:
        return [rows[i] for i in ids]

    feed = InvocationFeed(read_many=read_many, gather_s=0)
    with contextlib.ExitStack() as stack:
        if by_id:
            for _ in range(waiting):
                stack.enter_context(feed.awaiting(uuid.uuid4()))
            subscriptions = []
        else:
            subscriptions = [
                stack.enter_context(feed.subscribe(TENANTS[n % len(TENANTS)]))
                for n in range(waiting)
            ]
        started = time.process_time()
        for start in range(0, notices, BATCH):
            for invocation_id in noticed[start : start + BATCH]:
                feed.notice(str(invocation_id))
            await feed.deliver()
            for subscription in subscriptions:  # each wait looks at what it was offered
                while not subscription.queue.empty():
                    subscription.queue.get_nowait()
        return (time.process_time() - started) / notices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, nargs="+", default=[10, 200, 2000])
    parser.add_argument("--notices", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for waiting in args.waiting:
        best = {
            by_id: min(
                asyncio.run(_run(waiting, args.notices, by_id=by_id)) for _ in range(args.repeat)
            )
            for by_id in (False, True)
        }
        print(
            f"{waiting:5d} reads waiting: subscribed {best[False] * 1e6:7.1f} µs a notice, "
            f"by id {best[True] * 1e6:5.2f} µs ({best[False] / best[True]:.0f}x less)"
        )


if __name__ == "__main__":
    main()
