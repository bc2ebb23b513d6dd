"""How soon a token revocation reaches another process, beside a bare pub/sub hop.

    python bench/revocation_push_bench.py [--n 200]

Fleet: every door (API, policy, executor) asks a ``CachedRevocationList`` that remembers
answers (here for 300 s, so only the push can end a stale one). A writer does what
``toolfleet token revoke`` does: store the ``jti`` in Redis and publish it on
``token:revocations``. A reader, with its own connection, cache and listener, has "not
revoked" cached for the ``jti`` and asks in a loop until it answers "revoked".
Latency = from the start of the revocation to the first "revoked".

Baseline, same run, same Redis: a bare PUBLISH until a subscriber on another
connection receives it (``policy_push_bench.measure_bare_pubsub``).

Only loopback traffic: Redis comes from ``TOOLFLEET_REDIS_URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from e2e_bench import RESULTS_DIR, RunResult, summarize
from policy_push_bench import measure_bare_pubsub
from toolfleet.auth.revocation import CachedRevocationList, RedisRevocationList
from toolfleet.storage.redis import connect_redis

#: How often the reader asks while it waits (its cache answers until the push lands).
POLL_S = 0.0005


async def measure_revocation_push(redis_url: str, n: int) -> RunResult:
    writer_redis, reader_redis = connect_redis(redis_url), connect_redis(redis_url)
    writer = RedisRevocationList(writer_redis)
    reader = CachedRevocationList(RedisRevocationList(reader_redis), ttl_s=300)
    stop, subscribed = asyncio.Event(), asyncio.Event()
    listener = asyncio.create_task(reader.listen(reader_redis, stop, subscribed=subscribed))
    latencies: list[float] = []
    try:
        await asyncio.wait_for(subscribed.wait(), timeout=10)
        began = time.perf_counter()
        for _ in range(n):
            jti = f"bench-{uuid.uuid4()}"
            assert not await reader.is_revoked(jti)  # cached "not revoked" from here on
            start = time.perf_counter()
            await writer.revoke(jti, ttl_s=60)
            # Asking in a loop is the measurement: a door asks per request.
            while not await reader.is_revoked(jti):  # noqa: ASYNC110
                await asyncio.sleep(POLL_S)
            latencies.append(time.perf_counter() - start)
        elapsed = time.perf_counter() - began
    finally:
        stop.set()
        await listener
        for client in (writer_redis, reader_redis):
            await client.aclose()
    return summarize("revocation seen", latencies, {"success": len(latencies)}, elapsed)


async def bench(n: int) -> dict[str, Any]:
    redis_url = os.environ.get("TOOLFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")
    fleet = await measure_revocation_push(redis_url, n)
    baseline = await measure_bare_pubsub(redis_url, n)
    return {"fleet": asdict(fleet), "baseline": asdict(baseline)}


def table(fleet: dict[str, Any], baseline: dict[str, Any]) -> str:
    rows = [f"{'metric':<18}{'revocation':>15}{'bare pub/sub':>15}{'ratio':>8}", "-" * 56]
    for key, label in (("p50_ms", "p50 (ms)"), ("p99_ms", "p99 (ms)"), ("max_ms", "max (ms)")):
        ratio = fleet[key] / baseline[key] if baseline[key] else float("nan")
        rows.append(f"{label:<18}{fleet[key]:>15.2f}{baseline[key]:>15.2f}{ratio:>8.1f}")
    rows.append(f"{'revocations':<18}{fleet['completed']:>15}{baseline['completed']:>15}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200, help="revocations measured")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    args = parser.parse_args(argv)
    if not 1 <= args.n <= 10_000:
        parser.error("--n must be between 1 and 10000")
    results = asyncio.run(bench(args.n))
    print(table(results["fleet"], results["baseline"]))
    if not args.no_save:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        path = RESULTS_DIR / f"revocation-push-{stamp}.json"
        path.write_text(json.dumps(results, indent=2))
        print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
