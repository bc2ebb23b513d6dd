"""What projecting a call's five lifecycle events costs the status worker and Postgres.

    python bench/status_store_bench.py [--calls 3000] [--batch 150] [--gap 30] [--repeat 3]
                                       [--one-database] [--gc worker|default]

``StatusProjector.on_events`` over ``PostgresProjection`` (the status worker's path from
decoded events to committed rows) in a throwaway database on ``TOOLFLEET_DATABASE_URL``
(default: the local Postgres). The events of ``--calls`` invocations (requested,
authorized, invoked, executed, outcome) are ordered as a saturated fleet delivers them:
each stage ``--gap`` calls behind the one before, in batches of ``--batch`` events (what
one observer fetch carries), so a call's events land in different batches and its row is
read and written several times. Prints, best of ``--repeat`` runs, the CPU per call of
this process (facts, codecs, the driver) and of the Postgres server (the postmaster and
its children, read from ``/proc``: run it as the server's user or root), and wall time.
The collector is set up as the status worker sets it up (:func:`toolfleet.worker.settle_heap`)
once the first run's events are built; ``--gc default`` leaves CPython's defaults, under which
collections walking the 15,000 events the bench holds cost the client a share no worker
pays (a worker holds one fetch).

Measured on the 2-core dev container (2026-11-27), per call: one upsert per changed row
(``executemany``): client 0.31 ms, Postgres 0.26 ms; one statement for the batch's
changed rows (``unnest``): client 0.31 ms, Postgres 0.20 ms. The marks and the changed
rows each as one JSON parameter (``jsonb_to_recordset``), two pairs on a slower box:
client 0.47 / 0.41 -> 0.37 / 0.32 ms, Postgres 0.34 / 0.24 -> 0.28 / 0.26 ms. Rerun rather
than trust these.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tests.support.lifecycle import Lifecycle

from probes import cpu_seconds, listening_pids
from toolfleet.events.envelope import Envelope
from toolfleet.status.service import StatusProjector
from toolfleet.status.store import PostgresProjection
from toolfleet.storage.postgres import create_pool, dsn_with_database, migrate
from toolfleet.worker import settle_heap, young_gc_threshold

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


@functools.cache
def settle_heap_once() -> None:
    """:func:`toolfleet.worker.settle_heap`, once per process as a worker does: the events
    of later runs stay collectable (the soak bench runs many in one process and reads
    its memory), with the status worker's young-generation threshold."""
    settle_heap(young_threshold=young_gc_threshold("status"))


def postgres_cpu_s(port: int) -> float:
    """CPU seconds so far of the Postgres server listening on ``port`` and its children."""
    server = listening_pids([port]).get(port)
    if server is None:
        raise SystemExit(f"no Postgres process found listening on port {port}")
    return sum(cpu_seconds([server]).values())


def saturated_order(calls: int, gap: int) -> list[Envelope]:
    """Every call's five events, stage ``j`` of call ``i`` at position ``i + j * gap``."""
    timed: list[tuple[int, int, Envelope]] = []
    for i in range(calls):
        lc = Lifecycle(tenant=f"t_{i % 50}")
        stages = (lc.requested(), lc.authorized(), lc.invoked(), lc.executed(), lc.outcome())
        timed.extend((i + j * gap, j, event) for j, event in enumerate(stages))
    timed.sort(key=lambda t: (t[0], t[1]))
    return [event for _, _, event in timed]


@contextlib.asynccontextmanager
async def projector_in_new_database(dsn: str) -> AsyncIterator[StatusProjector]:
    """The status worker's projector over a pool of a throwaway database (dropped after)."""
    database = f"toolfleet_bench_store_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f'CREATE DATABASE "{database}"')
    try:
        pool = await create_pool(dsn_with_database(dsn, database), min_size=2, max_size=4)
        try:
            await migrate(pool)
            yield StatusProjector(projection=PostgresProjection(pool))
        finally:
            await pool.close()
    finally:
        await admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
        await admin.close()


async def one_run(
    projector: StatusProjector, port: int, args: argparse.Namespace
) -> tuple[float, float, float]:
    """(client, Postgres, wall) ms per call of one run of fresh calls."""
    events = saturated_order(args.calls, args.gap)
    if args.gc == "worker":
        settle_heap_once()
    await projector.on_events(events[: args.batch])  # connections and plans warm
    measured = events[args.batch :]
    client, server, wall = time.process_time(), postgres_cpu_s(port), time.perf_counter()
    for start in range(0, len(measured), args.batch):
        await projector.on_events(measured[start : start + args.batch])
    calls = len(measured) / 5
    return (
        (time.process_time() - client) / calls * 1000,
        (postgres_cpu_s(port) - server) / calls * 1000,
        (time.perf_counter() - wall) / calls * 1000,
    )


async def main(args: argparse.Namespace) -> None:
    dsn = os.environ.get("TOOLFLEET_DATABASE_URL", DEFAULT_DSN)
    server_port = urlsplit(dsn).port or 5432
    runs = []
    if args.one_database:  # one projector for every run, as a worker keeps it
        async with projector_in_new_database(dsn) as projector:
            runs = [await one_run(projector, server_port, args) for _ in range(args.repeat)]
    else:  # each run in a fresh database, so none reads rows an earlier one wrote
        for _ in range(args.repeat):
            async with projector_in_new_database(dsn) as projector:
                runs.append(await one_run(projector, server_port, args))
    client, server, wall = (min(values) for values in zip(*runs, strict=True))
    print(
        f"status projection, per call (5 events), best of {args.repeat}: "
        f"client {client:.3f} ms, postgres {server:.3f} ms, wall {wall:.3f} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=150, help="events per projection call")
    parser.add_argument("--gap", type=int, default=30, help="calls between a call's stages")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--one-database",
        action="store_true",
        help="every run through one projector and database (soak_bench.py), not a fresh one each",
    )
    parser.add_argument(
        "--gc",
        choices=("worker", "default"),
        default="worker",
        help="the collector as a worker sets it (default) or CPython's defaults",
    )
    asyncio.run(main(parser.parse_args()))
