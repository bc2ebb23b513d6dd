"""Version pins of a call: the version of each document its first read got.

Stored beside the call's checkpoints (``checkpoint:tool:{invocation_id}:documents``, a
Redis hash, the checkpoint TTL) and written with ``HSETNX`` at the first read, before
the tool sees the content: whichever run of the call (a resume after a crash, a retry,
another worker) reads the document next gets the same version, whatever the source
serves by then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the Redis adapter's type only: the twin works on a core install
    from redis.asyncio import Redis


def pins_key(invocation_id: str) -> str:
    return f"checkpoint:tool:{invocation_id}:documents"


class DocumentPins(Protocol):
    """One call's pins: ``document_id`` → version."""

    async def get(self, document_id: str) -> str | None: ...
    async def pin(self, document_id: str, version: str) -> str:
        """Pin ``version`` unless a pin exists; return the pinned version either way."""
        ...


class RedisDocumentPins:
    def __init__(self, redis: Redis, invocation_id: str, *, ttl_s: int) -> None:
        self._redis = redis
        self._key = pins_key(invocation_id)
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
    """The pins of each call, by invocation id."""

    def __call__(self, invocation_id: str) -> DocumentPins: ...


class RedisPinBook:
    def __init__(self, redis: Redis, *, ttl_s: int) -> None:
        self._redis = redis
        self._ttl_s = ttl_s

    def __call__(self, invocation_id: str) -> DocumentPins:
        return RedisDocumentPins(self._redis, invocation_id, ttl_s=self._ttl_s)


class MemoryPinBook:
    """In-process :class:`PinBook`: a resumed call on the same book finds its pins."""

    def __init__(self) -> None:
        self.calls: dict[str, dict[str, str]] = {}

    def __call__(self, invocation_id: str) -> DocumentPins:
        return MemoryDocumentPins(self.calls.setdefault(invocation_id, {}))
