"""The DBOS peer of ``e2e_bench.py``: a durable workflow of four steps, same machine, same run.

    python bench/dbos_peer.py [--n 2000] [--paced 300] [--in-flight 10,40,200]  # one JSON object

DBOS Transact 3.x (``DBOS(config=...)``, ``DBOS.launch()``) runs, in this process, a
workflow of four ``@DBOS.step`` functions doing the trivial equivalent of the fleet's work
on a ``core__echo`` call: ``authorize`` (check a token-ish value), ``execute`` (echo the
parameters), ``validate`` (check the result against a small schema), ``audit`` (build an
audit record). ``--mode async`` (the default) runs async workflows and steps on one event
loop, as the fleet's client is; ``--mode sync`` runs synchronous ones on DBOS's executor
threads, a client thread per workflow in flight. Its system database is a Postgres
database of its own on the server of ``--database-url`` (default ``TOOLFLEET_DATABASE_URL``,
else ``postgresql://postgres@127.0.0.1:5432/postgres``), created at the start and dropped
at the end, also when the run fails. Measured:

- paced: ``--paced`` workflows one at a time (start -> result): p50 / p99;
- saturated: ``--n`` workflows shared out among the ``--in-flight`` levels (10, 40 and 200
  workflows in flight); the best level's throughput is the peer's, and its CPU per
  workflow is read over that level's run;
- CPU per workflow of this process and of the Postgres backends serving its database
  (found in ``pg_stat_activity`` by database name, by pid); the whole Postgres server
  (the process listening on the port, its children too, as ``e2e_bench.py`` reads
  ``servers on the same cores``) apart, since it also serves whatever else the machine runs;
- RSS of this process at the end.

What each side guarantees, so that the figures compare like with like:

- DBOS runs with its defaults: every workflow's input and status and every step's output
  are written to Postgres before the next step runs (one commit per checkpoint, with the
  server's ``synchronous_commit``, printed as ``postgres_synchronous_commit``). A process
  that dies mid-workflow is recovered on restart from the last completed step; a step is
  at-least-once (at-most-once only if it finishes before a crash), the workflow
  exactly-once in effect when its steps are idempotent. It has no broker: the client
  starts the workflow in the same process that runs it, so no hop crosses a process.
- The fleet publishes each call to Kafka and passes it through four worker processes
  (policy, executor, validator, then audit and status), each committing offsets only
  after its output is acknowledged (at-least-once, idempotent handlers, dedupe in Redis),
  with a real capability-token check, policy, tenant isolation and a status projection in
  Postgres; the durable record is the broker's log, not a database row per step.

So DBOS here is the cheapest durable path the contract's four stages could take in one
process; the fleet pays process hops and a broker for isolation and horizontal scale.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from dbos import DBOS, DBOSConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probes import cpu_seconds, listening_pids, rss_mb

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
GRANT = "cap.bench.core__echo"
"""The token-ish value ``authorize`` checks (a prefix and the tool's name)."""
RESULT_SCHEMA: dict[str, type] = {"message": str, "n": int}
"""The small schema ``validate`` checks the echoed result against: field -> type."""


def _authorize(token: str, tool: str) -> bool:
    if not token.startswith("cap.") or not token.endswith(tool):
        raise PermissionError("token does not grant the tool")
    return True


def _validate(result: dict[str, Any]) -> bool:
    return set(result) == set(RESULT_SCHEMA) and all(
        isinstance(result[k], t) for k, t in RESULT_SCHEMA.items()
    )


def _audit(tenant: str, tool: str, valid: bool) -> dict[str, Any]:
    return {"tenant": tenant, "tool": tool, "status": "success" if valid else "failed",
            "at_ms": int(time.time() * 1000)}  # fmt: skip


# The synchronous workflow (``--mode sync``): DBOS runs it on its executor threads.
@DBOS.step()
def authorize(token: str, tool: str) -> bool:
    return _authorize(token, tool)


@DBOS.step()
def execute(params: dict[str, Any]) -> dict[str, Any]:
    return dict(params)


@DBOS.step()
def validate(result: dict[str, Any]) -> bool:
    return _validate(result)


@DBOS.step()
def audit(tenant: str, tool: str, valid: bool) -> dict[str, Any]:
    return _audit(tenant, tool, valid)


@DBOS.workflow()
def echo_call(tenant: str, token: str, params: dict[str, Any]) -> dict[str, Any]:
    tool = "core__echo"
    authorize(token, tool)
    result = execute(params)
    record = audit(tenant, tool, validate(result))
    return {"result": result, "audit": record}


# The asynchronous one (``--mode async``): on this process's event loop.
@DBOS.step()
async def authorize_async(token: str, tool: str) -> bool:
    return _authorize(token, tool)


@DBOS.step()
async def execute_async(params: dict[str, Any]) -> dict[str, Any]:
    return dict(params)


@DBOS.step()
async def validate_async(result: dict[str, Any]) -> bool:
    return _validate(result)


@DBOS.step()
async def audit_async(tenant: str, tool: str, valid: bool) -> dict[str, Any]:
    return _audit(tenant, tool, valid)


@DBOS.workflow()
async def echo_call_async(tenant: str, token: str, params: dict[str, Any]) -> dict[str, Any]:
    tool = "core__echo"
    await authorize_async(token, tool)
    result = await execute_async(params)
    record = await audit_async(tenant, tool, await validate_async(result))
    return {"result": result, "audit": record}


def _args(i: int) -> tuple[str, str, dict[str, Any]]:
    return f"tenant-{i % 50}", GRANT, {"message": "hello", "n": i}


def _checked(i: int, out: dict[str, Any]) -> None:
    if out["audit"]["status"] != "success" or out["result"]["n"] != i:
        raise RuntimeError(f"workflow {i} ended {out['audit']['status']}")


def one_call(i: int) -> float:
    """Start one (synchronous) workflow and wait for its result: seconds taken."""
    t0 = time.perf_counter()
    _checked(i, DBOS.start_workflow(echo_call, *_args(i)).get_result())
    return time.perf_counter() - t0


async def one_call_async(i: int) -> float:
    """Start one asynchronous workflow and await its result: seconds taken."""
    t0 = time.perf_counter()
    handle = await DBOS.start_workflow_async(echo_call_async, *_args(i))
    _checked(i, await handle.get_result())
    return time.perf_counter() - t0


def saturate(n: int, in_flight: int, mode: str, loop: asyncio.Runner) -> float:
    """``n`` workflows, ``in_flight`` at a time: seconds taken."""
    started = time.perf_counter()
    if mode == "async":

        async def run() -> None:
            gate = asyncio.Semaphore(in_flight)

            async def gated(i: int) -> None:
                async with gate:
                    await one_call_async(i)

            await asyncio.gather(*(gated(i) for i in range(n)))

        loop.run(run())
    else:
        with ThreadPoolExecutor(max_workers=in_flight, thread_name_prefix="client-") as pool:
            list(pool.map(one_call, range(n)))
    return time.perf_counter() - started


def paced_calls(paced: int, mode: str, loop: asyncio.Runner) -> list[float]:
    if mode == "async":

        async def run() -> list[float]:
            return [await one_call_async(i) for i in range(paced)]

        return loop.run(run())
    return [one_call(i) for i in range(paced)]


def pct(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


@contextlib.contextmanager
def own_database(server_url: str) -> Iterator[str]:
    """A database of its own on ``server_url``'s server, dropped on the way out: its URL."""
    name = f"toolfleet_dbos_bench_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(server_url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass(frozen=True, kw_only=True)
class Probe:
    """Where the CPU of a phase is read: this process, its database's backends, the server."""

    server_url: str
    database: str
    server_pid: int | None

    def backends(self) -> list[int]:
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.database,)
            ).fetchall()
        return [int(row[0]) for row in rows]

    def read(self) -> dict[str, dict[int, float]]:
        return {
            "dbos": cpu_seconds([os.getpid()], children=False),
            "postgres_backends": cpu_seconds(self.backends(), children=False),
            "postgres_server": cpu_seconds([self.server_pid]) if self.server_pid else {},
        }


def used(
    before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]
) -> dict[str, float]:
    """CPU seconds by group between two reads (a process born meanwhile counts from zero)."""
    return {
        group: max(sum(s - before.get(group, {}).get(pid, 0.0) for pid, s in pids.items()), 0.0)
        for group, pids in after.items()
    }


def _set(in_flight: str) -> list[int]:
    return [int(v) for v in in_flight.split(",") if v.strip()]


def measure(
    n: int, paced: int, in_flight: Sequence[int], server_url: str, mode: str = "async"
) -> dict[str, Any]:
    logging.getLogger("dbos").setLevel(logging.WARNING)
    port = urlsplit(server_url).port or 5432
    with contextlib.ExitStack() as stack:
        url = stack.enter_context(own_database(server_url))
        config: DBOSConfig = {
            "name": "toolfleet-bench-peer",
            "system_database_url": url,
            "log_level": "WARNING",
        }
        DBOS(config=config)
        stack.callback(DBOS.destroy, destroy_registry=False)
        # One event loop for every phase: DBOS makes its thread pool the loop's default
        # executor once, and closing a loop (asyncio.run) shuts that pool down.
        runner = stack.enter_context(asyncio.Runner())
        DBOS.launch()
        with psycopg.connect(url) as conn:
            sync_commit = str(conn.execute("SHOW synchronous_commit").fetchone()[0])  # type: ignore[index]
            fsync = str(conn.execute("SHOW fsync").fetchone()[0])  # type: ignore[index]
        probe = Probe(
            server_url=server_url,
            database=urlsplit(url).path.lstrip("/"),
            server_pid=listening_pids([port]).get(port),
        )
        return _phases(n, paced, in_flight, probe, mode, runner) | {
            "postgres_synchronous_commit": sync_commit,
            "postgres_fsync": fsync,
        }
    raise AssertionError("unreachable")  # pragma: no cover


def _phases(
    n: int, paced: int, in_flight: Sequence[int], probe: Probe, mode: str, loop: asyncio.Runner
) -> dict[str, Any]:
    saturate(min(n, 200), min(max(in_flight), 50), mode, loop)  # warm-up: pool, plans, code paths

    n = max(n // len(in_flight), 1)  # each level runs its share of --n
    levels: dict[int, dict[str, Any]] = {}
    for k in in_flight:
        before = probe.read()
        elapsed = saturate(n, k, mode, loop)
        cpu = used(before, probe.read())
        levels[k] = {"throughput_per_s": n / elapsed, "cpu_s": cpu}
    best = max(levels, key=lambda k: levels[k]["throughput_per_s"])
    cpu = levels[best]["cpu_s"]

    before = probe.read()
    latencies = paced_calls(paced, mode, loop)
    paced_cpu = used(before, probe.read())
    latencies.sort()

    per = max(n, 1)
    counted = cpu["dbos"] + cpu["postgres_backends"]
    return {
        "name": f"dbos (3.x, postgres system db, 4 {mode} steps, defaults)",
        "mode": mode,
        "n_per_level": n,
        "in_flight": best,
        "throughput_per_s": levels[best]["throughput_per_s"],
        "throughput_per_s_by_in_flight": {str(k): v["throughput_per_s"] for k, v in levels.items()},
        "cpu_ms_per_workflow": counted / per * 1000,
        "cpu_ms_per_workflow_by_process": {
            "dbos": cpu["dbos"] / per * 1000,
            "postgres_backends": cpu["postgres_backends"] / per * 1000,
        },
        "postgres_server_cpu_ms_per_workflow": cpu["postgres_server"] / per * 1000,
        "paced_cpu_ms_per_workflow": (paced_cpu["dbos"] + paced_cpu["postgres_backends"])
        / max(paced, 1)
        * 1000,
        "paced_p50_ms": pct(latencies, 0.50),
        "paced_p99_ms": pct(latencies, 0.99),
        "paced_mean_ms": statistics.fmean(latencies) * 1000 if latencies else 0.0,
        "rss_mb": sum(rss_mb([os.getpid()]).values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--n", type=int, default=2000, help="workflows in the saturated runs, all levels"
    )
    parser.add_argument("--paced", type=int, default=300, help="workflows run one at a time")
    parser.add_argument(
        "--in-flight", type=_set, default=[10, 40, 200], help="levels, comma-separated"
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("TOOLFLEET_DATABASE_URL", DEFAULT_DATABASE_URL),
        help="a database on the Postgres server to use (the peer makes its own there)",
    )
    parser.add_argument(
        "--mode",
        choices=("sync", "async"),
        default="async",
        help="sync: workflows on DBOS's threads, a client thread per call in flight; "
        "async: async workflows and steps on one event loop (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.n < 1 or args.paced < 0 or not args.in_flight or min(args.in_flight) < 1:
        parser.error("--n >= 1, --paced >= 0, --in-flight levels >= 1")
    print(json.dumps(measure(args.n, args.paced, args.in_flight, args.database_url, args.mode)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
