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

import asyncio
import os
import time
import uuid
from dataclasses import asdict
from typing import Any

from e2e_bench import RunResult, summarize
from policy_push_bench import measure_bare_pubsub, push_main
from toolfleet.storage.redis import connect_redis
from toolfleet.storage.revocation import CachedRevocationList, RedisRevocationList

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


def main(argv: list[str] | None = None) -> int:
    return push_main(
        argv,
        doc=__doc__ or "",
        what="revocation",
        count="revocations",
        slug="revocation-push",
        run=bench,
    )


if __name__ == "__main__":
    raise SystemExit(main())
