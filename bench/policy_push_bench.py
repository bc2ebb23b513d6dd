"""How soon a policy change reaches another policy process, beside a bare pub/sub hop.

    python bench/policy_push_bench.py [--n 200]

Fleet: a tenant's policy is cached for 300 s in every policy process (a local layer,
then the shared Redis entry). One writer does what ``toolfleet policy apply`` and
``PUT /v1/policies/{tenant}`` do: commit the new version to Postgres, then announce it
(bump the shared entry's epoch, publish the tenant on ``policy:updates``). A reader,
with its own connections, its own provider and its own invalidation listener, asks
for the tenant's policy in a loop until it sees the new version. Latency = from the
start of the commit to the first answer with the new version.

Baseline, same run, same Redis: a bare PUBLISH on another channel until a subscriber
with its own connection receives it. The ratio is what the cache layers, the Postgres
commit and the re-read cost beyond Redis pub/sub itself.

Only loopback traffic: Redis and Postgres come from ``TOOLFLEET_REDIS_URL`` /
``TOOLFLEET_DATABASE_URL`` (a throwaway database is created and dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from redis.asyncio import Redis

from e2e_bench import RESULTS_DIR, RunResult, summarize, throwaway_database
from toolfleet.policy.cache import RedisPolicyCache, run_invalidation_listener
from toolfleet.policy.documents import TenantPolicy
from toolfleet.policy.postgres_policies import PolicyStore
from toolfleet.policy.provider import PolicyProvider
from toolfleet.storage.postgres import create_pool, migrate
from toolfleet.storage.redis import connect_redis

#: Two policies the writer alternates between.
POLICIES = (TenantPolicy(allow_tools=["core__*"]), TenantPolicy(allow_tools=["core__echo"]))
#: How often the reader asks while it waits (the local cache answers between changes).
POLL_S = 0.0005


@contextlib.asynccontextmanager
async def listening(redis: Redis, provider: PolicyProvider) -> AsyncIterator[None]:
    stop, subscribed = asyncio.Event(), asyncio.Event()
    listener = asyncio.create_task(
        run_invalidation_listener(redis, provider, stop, subscribed=subscribed)
    )
    await asyncio.wait_for(subscribed.wait(), timeout=10)
    try:
        yield
    finally:
        stop.set()
        await listener


async def measure_policy_push(database_url: str, redis_url: str, n: int) -> RunResult:
    writer_pool = await create_pool(database_url, min_size=1, max_size=2)
    reader_pool = await create_pool(database_url, min_size=1, max_size=2)
    writer_redis, reader_redis = connect_redis(redis_url), connect_redis(redis_url)
    tenant = f"bench_{uuid.uuid4().hex[:8]}"
    store, announcer = PolicyStore(writer_pool), RedisPolicyCache(writer_redis)
    reader = PolicyProvider(PolicyStore(reader_pool), shared=RedisPolicyCache(reader_redis))
    latencies: list[float] = []
    try:
        await migrate(writer_pool)
        await store.put(tenant, POLICIES[0], "bench")
        await announcer.announce(tenant)
        async with listening(reader_redis, reader):
            began = time.perf_counter()
            for i in range(1, n + 1):
                wanted = POLICIES[i % 2]
                assert await reader.policy_for(tenant) != wanted  # cached, and stale next
                start = time.perf_counter()
                await store.put(tenant, wanted, "bench")
                await announcer.announce(tenant)
                # Asking in a loop is the measurement: a policy process asks per request.
                while await reader.policy_for(tenant) != wanted:  # noqa: ASYNC110
                    await asyncio.sleep(POLL_S)
                latencies.append(time.perf_counter() - start)
            elapsed = time.perf_counter() - began
    finally:
        for pool in (writer_pool, reader_pool):
            await pool.close()
        for client in (writer_redis, reader_redis):
            await client.aclose()
    return summarize("policy change seen", latencies, {"success": len(latencies)}, elapsed)


async def measure_bare_pubsub(redis_url: str, n: int) -> RunResult:
    publisher, subscriber = connect_redis(redis_url), connect_redis(redis_url)
    channel = f"bench:pubsub:{uuid.uuid4().hex[:8]}"
    pubsub = subscriber.pubsub()
    latencies: list[float] = []
    try:
        await pubsub.subscribe(channel)
        while await pubsub.get_message(timeout=1) is None:  # the subscribe confirmation
            pass
        began = time.perf_counter()
        for i in range(n):
            start = time.perf_counter()
            await publisher.publish(channel, str(i))
            while await pubsub.get_message(ignore_subscribe_messages=True, timeout=1) is None:
                pass
            latencies.append(time.perf_counter() - start)
        elapsed = time.perf_counter() - began
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await publisher.aclose()
        await subscriber.aclose()
    return summarize("bare pub/sub", latencies, {"success": len(latencies)}, elapsed)


async def bench(n: int) -> dict[str, Any]:
    admin = os.environ.get(
        "TOOLFLEET_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    redis_url = os.environ.get("TOOLFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")
    async with throwaway_database(admin) as database_url:
        fleet = await measure_policy_push(database_url, redis_url, n)
    baseline = await measure_bare_pubsub(redis_url, n)
    return {"fleet": asdict(fleet), "baseline": asdict(baseline)}


def push_table(fleet: dict[str, Any], baseline: dict[str, Any], *, what: str, count: str) -> str:
    """The push benchmarks' table: ``what`` beside a bare pub/sub round trip."""
    rows = [f"{'metric':<18}{what:>15}{'bare pub/sub':>15}{'ratio':>8}", "-" * 56]
    for key, label in (("p50_ms", "p50 (ms)"), ("p99_ms", "p99 (ms)"), ("max_ms", "max (ms)")):
        ratio = fleet[key] / baseline[key] if baseline[key] else float("nan")
        rows.append(f"{label:<18}{fleet[key]:>15.2f}{baseline[key]:>15.2f}{ratio:>8.1f}")
    rows.append(f"{count:<18}{fleet['completed']:>15}{baseline['completed']:>15}")
    return "\n".join(rows)


def push_main(
    argv: list[str] | None,
    *,
    doc: str,
    what: str,
    count: str,
    slug: str,
    run: Callable[[int], Awaitable[dict[str, Any]]],
) -> int:
    """Command line of a push benchmark: ``--n`` pushes, a table, results saved as JSON."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help=f"{count} measured")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    args = parser.parse_args(argv)
    if not 1 <= args.n <= 10_000:
        parser.error("--n must be between 1 and 10000")
    print("broker profile: none (no Kafka in this benchmark)")
    results = asyncio.run(run(args.n))
    print(push_table(results["fleet"], results["baseline"], what=what, count=count))
    if not args.no_save:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        path = RESULTS_DIR / f"{slug}-{stamp}.json"
        path.write_text(json.dumps(results, indent=2))
        print(f"results: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return push_main(
        argv,
        doc=__doc__ or "",
        what="policy change",
        count="changes",
        slug="policy-push",
        run=bench,
    )


if __name__ == "__main__":
    raise SystemExit(main())
