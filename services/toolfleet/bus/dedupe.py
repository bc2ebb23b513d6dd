"""Remembers which events a consumer group already processed (keyed by source + id)."""

from __future__ import annotations

import hashlib
from typing import Protocol

from redis.asyncio import Redis


class ProcessedEvents(Protocol):
    async def seen(self, key: str) -> bool: ...
    async def mark(self, key: str) -> None: ...


class RedisProcessedEvents:
    """``dedupe:{group}:{sha256(source, id)}`` markers with a TTL."""

    def __init__(self, redis: Redis, *, group: str, ttl_s: int) -> None:
        self._redis = redis
        self._prefix = f"dedupe:{group}:"
        self._ttl_s = ttl_s

    def _key(self, key: str) -> str:
        return self._prefix + hashlib.sha256(key.encode()).hexdigest()[:32]

    async def seen(self, key: str) -> bool:
        return bool(await self._redis.exists(self._key(key)))

    async def mark(self, key: str) -> None:
        await self._redis.set(self._key(key), b"1", ex=self._ttl_s)
