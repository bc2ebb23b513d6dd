"""Result cache of tools that declare ``Resilience(cache=Cache(...))``.

An entry is keyed by the deterministic call id: SHA-256 over the resolved
``tool_id@version``, the canonical parameters (sorted-keys JSON) and the tenant id, so
tenants never share entries. It holds the raw (unvalidated) result of a successful run:
the validator validates and redacts a hit like any other result. Failures are never
stored, and tools that declare credentials cannot declare a cache.

Because an entry is a raw result, Redis holds it sealed (AES-GCM under the fleet key's
``result-cache`` key, bound to its cache key: :mod:`toolfleet.storage.at_rest`) when a
fleet key is configured. An entry that does not open (written in plaintext before the
upgrade, sealed under a key rotated out, or altered) is a miss: the tool runs again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any, Protocol

from redis.asyncio import Redis

from toolfleet.storage.at_rest import AtRestCipher
from toolfleet.tools.resilience import Cache


def call_id(*, tool_id: str, tool_version: str, parameters: dict[str, Any], tenant_id: str) -> str:
    """The deterministic id of a call: same tool version, parameters and tenant, same id."""
    canonical = json.dumps(
        parameters, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str
    )
    digest = hashlib.sha256()
    for part in (f"{tool_id}@{tool_version}", canonical, tenant_id):
        digest.update(part.encode())
        digest.update(b"\x1f")
    return digest.hexdigest()


def cache_key(call: str) -> str:
    return f"cache:tool:{call}"


class ResultCache(Protocol):
    async def get(self, call_id: str) -> dict[str, Any] | None: ...
    async def put(self, call_id: str, result: dict[str, Any], policy: Cache) -> None: ...


class RedisResultCache:
    def __init__(self, redis: Redis, *, cipher: AtRestCipher | None = None) -> None:
        self._redis = redis
        self._cipher = cipher

    async def get(self, call_id: str) -> dict[str, Any] | None:
        key = cache_key(call_id)
        raw = await self._redis.get(key)
        if raw is None:
            return None
        if self._cipher is not None:
            opened = self._cipher.open(raw, aad=key.encode()) if isinstance(raw, bytes) else None
            if opened is None:
                return None
            raw = opened
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    async def put(self, call_id: str, result: dict[str, Any], policy: Cache) -> None:
        key = cache_key(call_id)
        raw = json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode()
        if self._cipher is not None:
            raw = self._cipher.seal(raw, aad=key.encode())
        ttl = policy.ttl_s if policy.mode == "ttl" else None
        await self._redis.set(key, raw, ex=ttl)


class MemoryResultCache:
    """In-process :class:`ResultCache` for tests; ``ttl`` entries expire on ``clock``."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.entries: dict[str, tuple[dict[str, Any], float | None]] = {}
        self._clock = clock

    async def get(self, call_id: str) -> dict[str, Any] | None:
        entry = self.entries.get(call_id)
        if entry is None:
            return None
        result, expires_at = entry
        if expires_at is not None and expires_at <= self._clock():
            del self.entries[call_id]
            return None
        return dict(result)

    async def put(self, call_id: str, result: dict[str, Any], policy: Cache) -> None:
        expires_at = self._clock() + policy.ttl_s if policy.mode == "ttl" else None
        self.entries[call_id] = (dict(result), expires_at)
