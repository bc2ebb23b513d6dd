"""Revoked capability tokens, by ``jti``.

A revocation is a Redis key ``token:revoked:{jti}`` that lives as long as the token
could still verify (its remaining lifetime plus the verification leeway), or a
configured maximum when that is unknown. Checking is a separate async step after
:meth:`~toolfleet.auth.tokens.TokenVerifier.verify`, which stays free of I/O.

A Redis failure while checking propagates (it is not "not revoked"): callers fail
closed or retry, never let a possibly revoked token through.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Protocol

from redis.asyncio import Redis

from toolfleet.auth.tokens import LEEWAY_S, Capability
from toolfleet.errors import PermissionDenied

KEY_PREFIX = "token:revoked:"
DEFAULT_MAX_TTL_S = 30 * 24 * 3600
_JTI = re.compile(r"[\x21-\x7e]{1,256}")


class RevocationList(Protocol):
    """Port: where revoked ``jti`` values are kept."""

    async def revoke(self, jti: str, *, ttl_s: int) -> None:
        """Remember ``jti`` as revoked for ``ttl_s`` seconds."""
        ...

    async def is_revoked(self, jti: str) -> bool:
        """Whether ``jti`` is revoked."""
        ...


def revocation_key(jti: str) -> str:
    """The Redis key of a revoked ``jti`` (``ValueError`` for a malformed jti)."""
    if not _JTI.fullmatch(jti):
        raise ValueError("a jti is 1 to 256 printable ASCII characters without spaces")
    return KEY_PREFIX + jti


def remaining_ttl_s(
    expires_at: int, *, max_ttl_s: int = DEFAULT_MAX_TTL_S, now: float | None = None
) -> int:
    """How long to remember the revocation of a token expiring at ``expires_at``."""
    current = time.time() if now is None else now
    return max(1, min(max_ttl_s, int(expires_at - current) + LEEWAY_S + 1))


class RedisRevocationList:
    """:class:`RevocationList` on Redis: ``SET token:revoked:{jti} 1 EX ttl``."""

    def __init__(self, redis: Redis, *, max_ttl_s: int = DEFAULT_MAX_TTL_S) -> None:
        self._redis = redis
        self._max_ttl_s = max_ttl_s

    async def revoke(self, jti: str, *, ttl_s: int) -> None:
        ttl = max(1, min(ttl_s, self._max_ttl_s))
        await self._redis.set(revocation_key(jti), b"1", ex=ttl)

    async def revoke_capability(self, capability: Capability) -> None:
        """Revoke a verified token for exactly as long as it could still verify."""
        await self.revoke(
            capability.jti,
            ttl_s=remaining_ttl_s(capability.expires_at, max_ttl_s=self._max_ttl_s),
        )

    async def is_revoked(self, jti: str) -> bool:
        try:
            key = revocation_key(jti)
        except ValueError:
            return True  # a jti no issuer of ours produces: treat as revoked
        return bool(await self._redis.exists(key))


class MemoryRevocationList:
    """In-process :class:`RevocationList` for tests and single-process tools."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._until: dict[str, float] = {}
        self._clock = clock

    async def revoke(self, jti: str, *, ttl_s: int) -> None:
        revocation_key(jti)
        self._until[jti] = self._clock() + ttl_s

    async def is_revoked(self, jti: str) -> bool:
        until = self._until.get(jti)
        return until is not None and until > self._clock()


async def ensure_not_revoked(revocations: RevocationList, capability: Capability) -> None:
    """:class:`PermissionDenied` when the verified token has been revoked."""
    if await revocations.is_revoked(capability.jti):
        raise PermissionDenied("capability token has been revoked")
