"""Remembers which events a consumer group already processed (keyed by source + id)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

from redis.asyncio import Redis

from toolfleet.storage.redis import CoalescedCommands


class ProcessedEvents(Protocol):
    async def seen(self, key: str) -> bool: ...
    async def mark(self, key: str) -> None: ...
    async def seen_all(self, keys: Sequence[str]) -> list[bool]:
        """``seen`` of each key, in one round trip."""
        ...

    async def mark_all(self, keys: Sequence[str]) -> None:
        """``mark`` of each key, in one round trip."""
        ...


class RedisProcessedEvents:
    """``dedupe:{group}:{sha256(source, id)}`` markers with a TTL.

    Every record in flight asks once before and marks once after: the calls made at
    about the same time share a round trip (:class:`CoalescedCommands`); a consumer that
    handles a fetch as one batch asks and marks for all its records in one pipeline.
    """

    def __init__(self, redis: Redis, *, group: str, ttl_s: int) -> None:
        self._redis = redis
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

    async def seen_all(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.exists(self._key(key))
        return [bool(reply) for reply in await pipe.execute()]

    async def mark_all(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        pipe = self._redis.pipeline(transaction=False)
        for key in keys:
            pipe.set(self._key(key), b"1", ex=self._ttl_s)
        await pipe.execute()
