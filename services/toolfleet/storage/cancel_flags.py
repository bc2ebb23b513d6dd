"""Cancel flags: policy writes one when a cancel is requested, every executor reads it.

``cancel:requested:{invocation_id}`` (contract section 5) lives for a day: long enough
for a queued or redelivered call to be refused before it runs, and for a running one to
see the cancel at its next checkpoint even when this worker missed the control event.
"""

from __future__ import annotations

from typing import Protocol

from redis.asyncio import Redis

from toolfleet.storage.redis import CoalescedCommands

__all__ = ["CANCEL_TTL_S", "CancelFlags", "MemoryCancelFlags", "RedisCancelFlags", "cancel_key"]

CANCEL_TTL_S = 24 * 3600
"""How long a cancel flag is kept."""


def cancel_key(invocation_id: str) -> str:
    return f"cancel:requested:{invocation_id}"


class CancelFlags(Protocol):
    """Raised by whoever accepts a cancel; read by whoever is about to run, or runs, a call."""

    async def request(self, invocation_id: str) -> None: ...
    async def is_requested(self, invocation_id: str) -> bool: ...


class RedisCancelFlags:
    """The flags in Redis; concurrent reads go out together in one pipeline."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._reads = CoalescedCommands(redis)

    async def request(self, invocation_id: str) -> None:
        await self._redis.set(cancel_key(invocation_id), b"1", ex=CANCEL_TTL_S)

    async def is_requested(self, invocation_id: str) -> bool:
        key = cancel_key(invocation_id)
        return bool(await self._reads.run(lambda pipe: pipe.exists(key)))


class MemoryCancelFlags:
    """In-process :class:`CancelFlags` for tests and single-process tools (no expiry)."""

    def __init__(self) -> None:
        self.requested: set[str] = set()

    async def request(self, invocation_id: str) -> None:
        self.requested.add(invocation_id)

    async def is_requested(self, invocation_id: str) -> bool:
        return invocation_id in self.requested
