"""Cancel flags: policy writes one when a cancel is requested, every executor reads it.

``cancel:requested:{<tenant_id>}:<invocation_id>`` (contract section 5, scoped by the
call's tenant: :mod:`toolfleet.storage.call_keys`) lives for a day: long enough
for a queued or redelivered call to be refused before it runs, and for a running one to
see the cancel at its next checkpoint even when this worker missed the control event.
"""

from __future__ import annotations

from typing import Protocol

from redis.asyncio import Redis

from toolfleet.events.identity import CallKey
from toolfleet.storage.call_keys import call_key
from toolfleet.storage.redis import CoalescedCommands

__all__ = ["CANCEL_TTL_S", "CancelFlags", "MemoryCancelFlags", "RedisCancelFlags", "cancel_key"]

CANCEL_TTL_S = 24 * 3600
"""How long a cancel flag is kept."""


def cancel_key(call: CallKey) -> str:
    return call_key("cancel:requested", call)


class CancelFlags(Protocol):
    """Raised by whoever accepts a cancel; read by whoever is about to run, or runs, a call."""

    async def request(self, call: CallKey) -> None: ...
    async def is_requested(self, call: CallKey) -> bool: ...


class RedisCancelFlags:
    """The flags in Redis; concurrent reads go out together in one pipeline."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._reads = CoalescedCommands(redis)

    async def request(self, call: CallKey) -> None:
        await self._redis.set(cancel_key(call), b"1", ex=CANCEL_TTL_S)

    async def is_requested(self, call: CallKey) -> bool:
        key = cancel_key(call)
        return bool(await self._reads.run(lambda pipe: pipe.exists(key)))


class MemoryCancelFlags:
    """In-process :class:`CancelFlags` for tests and single-process tools (no expiry)."""

    def __init__(self) -> None:
        self.requested: set[CallKey] = set()

    async def request(self, call: CallKey) -> None:
        self.requested.add(call)

    async def is_requested(self, call: CallKey) -> bool:
        return call in self.requested
