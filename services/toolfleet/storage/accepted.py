"""Calls the API accepted a moment ago: what lets a read right after a ``202`` wait.

The status projection trails a publish by a few milliseconds (more under load), so a
``GET`` of an invocation the API has just accepted could find no row and answer 404. The
API notes each call it publishes (:meth:`AcceptedCalls.accept`) and, when a read of the
caller's own tenant finds no row, waits for it only if the call was accepted
(:meth:`AcceptedCalls.was_accepted`): the caller's own just-submitted calls wait, an
unknown id or another tenant's is a 404 at once, and the two stay indistinguishable.

``accepted:<invocation_id>`` is a set of the tenants whose call of that id the API
accepted within :data:`ACCEPTED_TTL_S`. A call is ``(tenant_id, invocation_id)``, but an
admin reads by id alone, so the key is the id and the tenants are its members: a tenant
that reuses another's id only adds itself (its own wait), and reads only its own
membership. Nothing else reads or writes these keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from redis.asyncio import Redis

from toolfleet.events.identity import CallKey

__all__ = [
    "ACCEPTED_TTL_S",
    "AcceptedCalls",
    "MemoryAcceptedCalls",
    "RedisAcceptedCalls",
    "accepted_key",
]

ACCEPTED_TTL_S = 60
"""How long an accepted call is remembered: far beyond the projection's usual lag; a
read after that finds the row, or the call is lost to it (a 404, as before)."""


def accepted_key(invocation_id: str) -> str:
    return f"accepted:{invocation_id}"


class AcceptedCalls(Protocol):
    """Written by the API when it accepts a call; read when a read of it finds no row."""

    async def accept(self, call: CallKey) -> None: ...

    async def was_accepted(self, invocation_id: str, *, tenant_id: str | None) -> bool:
        """Whether ``tenant_id``'s call of that id (``None``: any tenant's) was accepted."""
        ...


class RedisAcceptedCalls:
    """The accepted calls in Redis: one round trip each way."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def accept(self, call: CallKey) -> None:
        key = accepted_key(call.invocation_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.sadd(key, call.tenant_id)
            pipe.expire(key, ACCEPTED_TTL_S)
            await pipe.execute()

    async def was_accepted(self, invocation_id: str, *, tenant_id: str | None) -> bool:
        key = accepted_key(invocation_id)
        if tenant_id is None:
            return bool(await self._redis.exists(key))
        return bool(await self._redis.sismember(key, tenant_id))


class MemoryAcceptedCalls:
    """In-process :class:`AcceptedCalls` for tests, with the same expiry on ``clock``."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[CallKey, float] = {}

    async def accept(self, call: CallKey) -> None:
        now = self._clock()
        self._until = {k: t for k, t in self._until.items() if t > now}
        self._until[call] = now + ACCEPTED_TTL_S

    async def was_accepted(self, invocation_id: str, *, tenant_id: str | None) -> bool:
        now = self._clock()
        return any(
            key.invocation_id == invocation_id
            and tenant_id in (None, key.tenant_id)
            and until > now
            for key, until in self._until.items()
        )
