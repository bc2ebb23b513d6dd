"""Remembers which events a consumer group already processed (keyed by source + id)."""

from __future__ import annotations

import hashlib
from typing import Protocol

from redis.asyncio import Redis

from toolfleet.storage.redis import CoalescedCommands


class ProcessedEvents(Protocol):
    async def seen(self, key: str) -> bool: ...
    async def mark(self, key: str) -> None: ...


class RedisProcessedEvents:
    """``dedupe:{group}:{sha256(source, id)}`` markers with a TTL.

    Every record in flight asks once before and marks once after: the calls made at
    about the same time share a round trip (:class:`CoalescedCommands`).
    """

    def __init__(self, redis: Redis, *, group: str, ttl_s: int) -> None:
        self._commands = CoalescedCommands(redis)
        self._prefix = f"dedupe:{group}:"
        self._ttl_s = ttl_s

    def _key(self, key: str) -> str:
        return self._prefix + hashlib.sha256(key.encode()).hexdigest()[:32]

    async def seen(self, key: str) -> bool:
        marker = self._key(key)
        return bool(await self._commands.run(lambda pipe: pipe.exists(marker)))

    async def mark(self, key: str) -> None:
        marker = self._key(key)
        await self._commands.run(lambda pipe: pipe.set(marker, b"1", ex=self._ttl_s))
