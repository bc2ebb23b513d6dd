"""Isolation benchmark: what a sandbox costs a ``core__echo``-sized call.

    python bench/isolation_bench.py [--n 50]

Three ways to run the same echo tool, each N times one after the other, latency from
the runtime's ``run`` call to its result (the executor's view of one attempt):

* in-process: ``run_tool`` in this event loop (``isolation="none"``);
* warm sandbox: a bubblewrap sandbox started ahead by the warm pool (the pool refills
  in the background between calls, as it does in the executor);
* cold sandbox: a sandbox started for the call (what calls with network grants get,
  and every call once the pools are drained);
* kept sandbox with a file grant: the warm worker kept for this tool and this grant
  (``warm_tools``), its module imported before the call;
* cold sandbox with a file grant: the same call with no pool for it (``warm_tools=0``);
* cold process: ``isolation="process"`` with no pool, so each call starts its worker:
  forked from the fork server (the default), or an interpreter started for it
  (``fork_server=False``).

Prints p50/p95 of each and the ratios to in-process. Only local processes; nothing is
sent anywhere. Results go to ``bench/results/isolation-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.hostile_tools import echo

from toolfleet.executor.runner import run_tool
from toolfleet.isolation.runtime import (
    Grants,
    IsolatedCall,
    IsolationRuntime,
    RuntimeConfig,
)
from toolfleet.isolation.sandbox import parse_filesystem_permissions
from toolfleet.tools.context import ToolContext
from toolfleet.tools.limits import AgentLimits, FleetLimits, Isolation, bound_limits
from toolfleet.tools.spec import spec_of

SPEC = spec_of(echo)
LIMITS = bound_limits(
    tool_id=SPEC.tool_id, tool=SPEC.limits, agent=AgentLimits(), fleet=FleetLimits(), timeout_s=10
)


def context(n: int) -> ToolContext:
    return ToolContext(
        tenant_id="bench",
        agent_did="did:agent:bench",
        invocation_id=f"bench-{n}",
        tool_id=SPEC.tool_id,
        tool_version=SPEC.version,
    )


#: A read-only file grant, as a token's ``filesystem_permissions`` gives one.
GRANT = Grants(binds=parse_filesystem_permissions(["/etc/ssl"]))


def call(grants: Grants | None = None, isolation: Isolation | None = None) -> IsolatedCall:
    return IsolatedCall(
        isolation=isolation or SPEC.isolation,
        tool_id=SPEC.tool_id,
        target=SPEC.target,
        parameters={"text": "hello"},
        limits=LIMITS,
        grants=grants or Grants(),
    )


async def in_process(n: int) -> list[float]:
    times = []
    for i in range(n):
        start = time.perf_counter()
        result = await run_tool(SPEC, {"text": "hello"}, context(i), timeout_s=10)
        times.append(time.perf_counter() - start)
        assert result.result == {"text": "hello"}
    return times


async def granted(n: int, *, kept: bool) -> list[float]:
    """Calls with a file grant: the kept worker of that grant, or a cold start each."""
    config = RuntimeConfig(warm_sandboxes=0, warm_processes=0, warm_tools=4 if kept else 0)
    async with IsolationRuntime(config=config) as runtime:
        times = []
        for i in range(n + 1):
            if kept:
                while i and not runtime.warm_for(call(GRANT)):  # noqa: ASYNC110 (refilled between calls)
                    await asyncio.sleep(0.01)
            start = time.perf_counter()
            result = await runtime.run(call(GRANT), context(i))
            if i:  # the first call starts cold and opens the pool
                times.append(time.perf_counter() - start)
            assert result.result == {"text": "hello"}, result.error
        return times


async def sandboxed(n: int, *, warm: bool) -> list[float]:
    config = RuntimeConfig(warm_sandboxes=1 if warm else 0, warm_processes=0, warm_tools=0)
    async with IsolationRuntime(config=config) as runtime:
        times = []
        for i in range(n):
            if warm:
                while runtime.warm(SPEC.isolation) == 0:  # noqa: ASYNC110 (refilled between calls)
                    await asyncio.sleep(0.01)
            start = time.perf_counter()
            result = await runtime.run(call(), context(i))
            times.append(time.perf_counter() - start)
            assert result.result == {"text": "hello"}, result.error
        return times


async def processes(n: int, *, fork_server: bool) -> list[float]:
    """Process workers started for each call: forked by the server, or interpreters."""
    config = RuntimeConfig(
        warm_sandboxes=0, warm_processes=0, warm_tools=0, fork_server=fork_server
    )
    async with IsolationRuntime(config=config) as runtime:
        times = []
        for i in range(n + 1):
            start = time.perf_counter()
            result = await runtime.run(call(isolation=Isolation.PROCESS), context(i))
            if i:  # the first call starts the fork server
                times.append(time.perf_counter() - start)
            assert result.result == {"text": "hello"}, result.error
        return times


def summary(times: list[float]) -> dict[str, float]:
    ordered = sorted(times)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))] * 1000, 3),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50)
    args = parser.parse_args()
    print("broker profile: none (tool isolation only; no Kafka in this benchmark)")
    runs: dict[str, Any] = {
        "in_process": summary(await in_process(args.n)),
        "warm_sandbox": summary(await sandboxed(args.n, warm=True)),
        "cold_sandbox": summary(await sandboxed(args.n, warm=False)),
        "kept_sandbox_file_grant": summary(await granted(args.n, kept=True)),
        "cold_sandbox_file_grant": summary(await granted(args.n, kept=False)),
        "cold_process_forked": summary(await processes(args.n, fork_server=True)),
        "cold_process_spawned": summary(await processes(args.n, fork_server=False)),
    }
    base = runs["in_process"]["p50_ms"]
    names = (
        "warm_sandbox",
        "cold_sandbox",
        "kept_sandbox_file_grant",
        "cold_sandbox_file_grant",
        "cold_process_forked",
        "cold_process_spawned",
    )
    for name in names:
        runs[name]["p50_vs_in_process"] = round(runs[name]["p50_ms"] / base, 1)
    runs["cold_vs_warm_p50"] = round(
        runs["cold_sandbox"]["p50_ms"] / runs["warm_sandbox"]["p50_ms"], 1
    )
    report = {"n": args.n, "host": platform.node(), "cores": _cores(), **runs}
    print(json.dumps(report, indent=2))
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / f"isolation-{time.strftime('%Y%m%dT%H%M%S')}.json").write_text(json.dumps(report))


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    asyncio.run(main())
