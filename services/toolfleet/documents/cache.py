"""Shared cache of document answers: Redis, 5 minutes, dropped on ``document:updates``.

Two kinds of entry per source: a version's content (``…:{id}:v:{version}``), which never
changes, and a document's metadata (``…:{id}:meta``), whose ``latest_version`` moves
when the document is updated. A writer that updates a document publishes its id on
:data:`CHANNEL`; every executor's :func:`~toolfleet.storage.invalidation.run_invalidation_listener`
hands it to :meth:`DocumentCache.invalidate`, which drops the metadata (content by
version stays valid). While the listener is down the metadata is not trusted (read from
the source); when it is back, every cached metadata of the source is dropped first.
Every entry also expires after ``ttl_s`` (the bound on staleness should a publish be lost).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from toolfleet.tools.documents import Document, DocumentMetadata

log = logging.getLogger(__name__)

CHANNEL = "document:updates"
"""Pub/sub channel on which a document's id is published when it changes."""
DEFAULT_TTL_S = 300


class CacheStore(Protocol):
    """Strings with a TTL (Redis; :class:`MemoryCacheStore` in tests)."""

    async def get(self, key: str) -> str | None: ...
    async def set(self, key: str, value: str, *, ttl_s: int) -> None: ...
    async def delete(self, key: str) -> None: ...
    async def delete_prefix(self, prefix: str, *, suffix: str) -> None: ...


class RedisCacheStore:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def get(self, key: str) -> str | None:
        raw = await self._redis.get(key)
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    async def set(self, key: str, value: str, *, ttl_s: int) -> None:
        await self._redis.set(key, value, ex=ttl_s)

    async def delete(self, key: str) -> None:
        await self._redis.delete(key)

    async def delete_prefix(self, prefix: str, *, suffix: str) -> None:
        batch: list[str | bytes] = []
        async for key in self._redis.scan_iter(match=f"{prefix}*{suffix}", count=500):
            batch.append(key)
            if len(batch) >= 500:
                await self._redis.delete(*batch)
                batch.clear()
        if batch:
            await self._redis.delete(*batch)


class MemoryCacheStore:
    """In-process :class:`CacheStore` whose TTLs run on an injected clock."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.entries: dict[str, tuple[str, float]] = {}

    async def get(self, key: str) -> str | None:
        entry = self.entries.get(key)
        if entry is None or entry[1] <= self._clock():
            self.entries.pop(key, None)
            return None
        return entry[0]

    async def set(self, key: str, value: str, *, ttl_s: int) -> None:
        self.entries[key] = (value, self._clock() + ttl_s)

    async def delete(self, key: str) -> None:
        self.entries.pop(key, None)

    async def delete_prefix(self, prefix: str, *, suffix: str) -> None:
        for key in [k for k in self.entries if k.startswith(prefix) and k.endswith(suffix)]:
            del self.entries[key]


class DocumentCache:
    """One source's cache, and the :class:`~toolfleet.storage.invalidation.InvalidationTarget`
    of ``document:updates``. A cache that fails is skipped, never fatal: the source answers."""

    def __init__(self, store: CacheStore, *, source: str, ttl_s: int = DEFAULT_TTL_S) -> None:
        self._store = store
        self._prefix = f"document:cache:{source}:"
        self._ttl_s = ttl_s
        self._trusted = False
        self._clearing: asyncio.Task[None] | None = None

    @property
    def trusted(self) -> bool:
        """Whether cached metadata may be used (the invalidation listener is live)."""
        return self._trusted

    def _content_key(self, document_id: str, version: str) -> str:
        return f"{self._prefix}{document_id}:v:{version}"

    def _meta_key(self, document_id: str) -> str:
        return f"{self._prefix}{document_id}:meta"

    async def content(self, document_id: str, version: str) -> Document | None:
        raw = await self._read(self._content_key(document_id, version))
        return None if raw is None else Document.model_validate_json(raw)

    async def metadata(self, document_id: str) -> DocumentMetadata | None:
        if not self._trusted:
            return None
        raw = await self._read(self._meta_key(document_id))
        return None if raw is None else DocumentMetadata.model_validate_json(raw)

    async def put_content(self, doc: Document) -> None:
        await self._write(self._content_key(doc.document_id, doc.version), doc.model_dump_json())

    async def put_metadata(self, meta: DocumentMetadata) -> None:
        if self._trusted:
            await self._write(self._meta_key(meta.document_id), meta.model_dump_json())

    # --- InvalidationTarget --------------------------------------------------------

    def after_subscribe(self) -> None:
        # Updates published while nobody listened were missed: drop all metadata first.
        self._clearing = asyncio.get_running_loop().create_task(self._clear_then_trust())

    def after_connection_lost(self) -> None:
        self._trusted = False
        if self._clearing is not None:
            self._clearing.cancel()
            self._clearing = None

    async def invalidate(self, key: str) -> None:
        try:
            await self._store.delete(self._meta_key(key))
        except (RedisError, OSError) as exc:
            log.warning("document cache entry not dropped: %s", type(exc).__name__)

    async def _clear_then_trust(self) -> None:
        try:
            await self._store.delete_prefix(self._prefix, suffix=":meta")
        except (RedisError, OSError) as exc:
            log.warning("document cache not cleared; left untrusted: %s", type(exc).__name__)
            return
        self._trusted = True

    async def _read(self, key: str) -> str | None:
        try:
            return await self._store.get(key)
        except (RedisError, OSError) as exc:
            log.warning("document cache unreadable: %s", type(exc).__name__)
            return None

    async def _write(self, key: str, value: str) -> None:
        try:
            await self._store.set(key, value, ttl_s=self._ttl_s)
        except (RedisError, OSError) as exc:
            log.warning("document cache not written: %s", type(exc).__name__)
