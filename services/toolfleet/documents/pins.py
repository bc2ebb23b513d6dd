"""Version pins of a call: the version of each document its first read got.

Stored beside the call's checkpoints
(``checkpoint:tool:{<tenant_id>}:<invocation_id>:documents``, a Redis hash, the checkpoint
TTL, and ``document_pins`` in Postgres, keyed by tenant and invocation, beside its durable
checkpoints, so a resume after Redis lost them keeps the versions) and written with
``HSETNX`` / ``ON CONFLICT DO NOTHING`` at the first read, before the tool sees the
content: whichever run of the call (a resume after a crash, a retry,
another worker) reads the document next gets the same version, whatever the source
serves by then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from toolfleet.events.identity import CallKey
from toolfleet.storage.call_keys import call_key

if TYPE_CHECKING:  # the adapters' types only: the twin works on a core install
    import asyncpg
    from redis.asyncio import Redis


def pins_key(call: CallKey) -> str:
    return call_key("checkpoint:tool", call, "documents")


class DocumentPins(Protocol):
    """One call's pins: ``document_id`` → version."""

    async def get(self, document_id: str) -> str | None: ...
    async def pin(self, document_id: str, version: str) -> str:
        """Pin ``version`` unless a pin exists; return the pinned version either way."""
        ...


class RedisDocumentPins:
    def __init__(self, redis: Redis, call: CallKey, *, ttl_s: int) -> None:
        self._redis = redis
        self._key = pins_key(call)
        self._ttl_s = ttl_s

    async def get(self, document_id: str) -> str | None:
        raw = await self._redis.hget(self._key, document_id)
        return _text(raw)

    async def pin(self, document_id: str, version: str) -> str:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hsetnx(self._key, document_id, version)
            pipe.hget(self._key, document_id)
            pipe.expire(self._key, self._ttl_s)
            _, pinned, _ = await pipe.execute()
        return _text(pinned) or version


class MemoryDocumentPins:
    """In-process :class:`DocumentPins`; share ``pins`` between two to play a resume."""

    def __init__(self, pins: dict[str, str] | None = None) -> None:
        self.pins: dict[str, str] = {} if pins is None else pins

    async def get(self, document_id: str) -> str | None:
        return self.pins.get(document_id)

    async def pin(self, document_id: str, version: str) -> str:
        return self.pins.setdefault(document_id, version)


def _text(raw: object) -> str | None:
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


class PinBook(Protocol):
    """The pins of each call."""

    def __call__(self, call: CallKey) -> DocumentPins: ...


class RedisPinBook:
    def __init__(self, redis: Redis, *, ttl_s: int) -> None:
        self._redis = redis
        self._ttl_s = ttl_s

    def __call__(self, call: CallKey) -> DocumentPins:
        return RedisDocumentPins(self._redis, call, ttl_s=self._ttl_s)


class MemoryPinBook:
    """In-process :class:`PinBook`: a resumed call on the same book finds its pins."""

    def __init__(self) -> None:
        self.calls: dict[CallKey, dict[str, str]] = {}

    def __call__(self, call: CallKey) -> DocumentPins:
        return MemoryDocumentPins(self.calls.setdefault(call, {}))


class PostgresDocumentPins:
    """One call's pins in ``document_pins`` (migrations 0006, 0010): they outlive Redis."""

    def __init__(self, pool: asyncpg.Pool, call: CallKey) -> None:
        self._pool = pool
        self._call = call

    async def get(self, document_id: str) -> str | None:
        version: str | None = await self._pool.fetchval(
            """SELECT version FROM document_pins
               WHERE tenant_id = $1 AND invocation_id = $2 AND document_id = $3""",
            self._call.tenant_id,
            self._call.invocation_id,
            document_id,
        )
        return version

    async def pin(self, document_id: str, version: str) -> str:
        pinned: str = await self._pool.fetchval(
            """WITH added AS (
                   INSERT INTO document_pins (tenant_id, invocation_id, document_id, version)
                   VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING RETURNING version)
               SELECT version FROM added
               UNION ALL
               SELECT version FROM document_pins
               WHERE tenant_id = $1 AND invocation_id = $2 AND document_id = $3
               LIMIT 1""",
            self._call.tenant_id,
            self._call.invocation_id,
            document_id,
            version,
        )
        return pinned


class TieredDocumentPins:
    """Redis first, Postgres as the record: a resume after Redis lost the hash keeps the
    versions (the Postgres pin wins, and is put back into Redis)."""

    def __init__(self, hot: DocumentPins, cold: DocumentPins) -> None:
        self._hot = hot
        self._cold = cold

    async def get(self, document_id: str) -> str | None:
        found = await self._hot.get(document_id)
        if found is not None:
            return found
        durable = await self._cold.get(document_id)
        if durable is not None:
            await self._hot.pin(document_id, durable)
        return durable

    async def pin(self, document_id: str, version: str) -> str:
        pinned = await self._cold.pin(document_id, version)
        await self._hot.pin(document_id, pinned)
        return pinned


class TieredPinBook:
    """:class:`PinBook` of :class:`TieredDocumentPins` (the executor's)."""

    def __init__(self, redis: Redis, pool: asyncpg.Pool, *, ttl_s: int) -> None:
        self._redis = redis
        self._pool = pool
        self._ttl_s = ttl_s

    def __call__(self, call: CallKey) -> DocumentPins:
        return TieredDocumentPins(
            RedisDocumentPins(self._redis, call, ttl_s=self._ttl_s),
            PostgresDocumentPins(self._pool, call),
        )
