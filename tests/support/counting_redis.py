"""A Redis client that counts its round trips (tests of batching)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from redis.asyncio import Redis

from toolfleet.storage.redis import connect_redis


class CountingRedis(Redis):
    """Counts round trips: pipelines sent and commands sent alone."""

    round_trips = 0

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        self.round_trips += 1
        return super().pipeline(transaction=transaction, shard_hint=shard_hint)

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        self.round_trips += 1
        return await super().execute_command(*args, **options)


@asynccontextmanager
async def counting_redis(redis_url: str) -> AsyncIterator[CountingRedis]:
    client = CountingRedis(connection_pool=connect_redis(redis_url).connection_pool)
    try:
        yield client
    finally:
        await client.aclose()
