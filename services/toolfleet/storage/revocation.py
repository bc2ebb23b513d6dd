"""Revoked capability tokens, by ``jti``.

A revocation is a Redis key ``token:revoked:{jti}`` that lives as long as the token
could still verify (its remaining lifetime plus the verification leeway), or a
configured maximum when that is unknown. Checking is a separate async step after
:meth:`~toolfleet.auth.tokens.TokenVerifier.verify`, which stays free of I/O.

A Redis failure while checking propagates (it is not "not revoked"): callers fail
closed or retry, never let a possibly revoked token through.

Every door checks: the HTTP API on each authenticated request, policy when it reads a
request, the executor before it runs a grant (:func:`ensure_grant_not_revoked`). They
ask a :class:`CachedRevocationList`, which remembers answers for a few seconds: Redis
stays the truth, and :meth:`RedisRevocationList.revoke` publishes the ``jti`` on
:data:`REVOCATIONS_CHANNEL` so every process drops its cached answer within a second
(the listener of :mod:`toolfleet.storage.invalidation`). Without a live subscription the
cache is bypassed, so a lost message can never keep a revoked token alive.

What a token opened stays open no longer than the token: a long response (a
Server-Sent Events stream, a long MCP call) :meth:`CachedRevocationList.watch`-es its
``jti`` and is woken by that same announcement (see :mod:`toolfleet.api.credential`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from redis.asyncio import Redis

from toolfleet.auth.capability import LEEWAY_S, Capability
from toolfleet.auth.grants import ExecutionGrant
from toolfleet.errors import PermissionDenied
from toolfleet.settings import FleetSettings
from toolfleet.storage.invalidation import run_invalidation_listener
from toolfleet.storage.redis import CoalescedCommands

KEY_PREFIX = "token:revoked:"
DEFAULT_MAX_TTL_S = 30 * 24 * 3600
REVOCATIONS_CHANNEL = "token:revocations"
"""Pub/sub channel announcing a revocation; the message is the ``jti``."""
DEFAULT_CACHE_TTL_S = 10.0
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
    """:class:`RevocationList` on Redis: ``SET token:revoked:{jti} 1 EX ttl``, then
    ``PUBLISH token:revocations {jti}``."""

    def __init__(
        self,
        redis: Redis,
        *,
        max_ttl_s: int = DEFAULT_MAX_TTL_S,
        channel: str = REVOCATIONS_CHANNEL,
    ) -> None:
        self._redis = redis
        self._max_ttl_s = max_ttl_s
        self._channel = channel
        self._reads = CoalescedCommands(redis)

    async def revoke(self, jti: str, *, ttl_s: int) -> None:
        """Store the revocation, then tell every process to drop its cached answer.

        Raises:
            RedisError: Redis is unreachable. When only the announcement failed, the
                revocation is stored and caches see it within their TTL.
        """
        ttl = max(1, min(ttl_s, self._max_ttl_s))
        await self._redis.set(revocation_key(jti), b"1", ex=ttl)
        await self._redis.publish(self._channel, jti)

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
        # Checks of many requests at once go out in one round trip.
        return bool(await self._reads.run(lambda pipe: pipe.exists(key)))


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


class CachedRevocationList:
    """A :class:`RevocationList` that remembers answers for ``ttl_s`` (one per process).

    Entries are trusted only while :meth:`listen` holds a live subscription to
    :data:`REVOCATIONS_CHANNEL`: a revocation announced there drops the ``jti``'s entry
    at once; a lost subscription drops every entry and sends every check to the source
    until it is back. The TTL only bounds the damage of a message lost on a connection
    that looks alive.

    Args:
        source: the truth (:class:`RedisRevocationList`).
        ttl_s: how long an answer is remembered (0 disables the cache).
        max_entries: bound of the cache (cleared when exceeded).
    """

    def __init__(
        self,
        source: RevocationList,
        *,
        ttl_s: float = DEFAULT_CACHE_TTL_S,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._ttl = ttl_s
        self._max = max_entries
        self._clock = clock
        self._answers: dict[str, tuple[bool, float]] = {}
        self._live = False
        self._generation = 0  # bumped by every invalidation: a slow read is not cached
        # Reads on the way, by jti: a check of the same generation waits for one of them
        # rather than sending its own (it could cache that very answer anyway).
        self._reading: dict[str, tuple[int, asyncio.Future[bool]]] = {}
        # Long responses waiting to hear of their token's revocation, by jti.
        self._watches: dict[str, set[asyncio.Event]] = {}

    @classmethod
    def from_settings(cls, redis: Redis, settings: FleetSettings) -> CachedRevocationList:
        """The cached list over Redis (``TOOLFLEET_REVOCATION_CACHE_TTL_S``); run :meth:`listen`."""
        return cls(
            RedisRevocationList(redis, max_ttl_s=settings.revocation_ttl_s),
            ttl_s=settings.revocation_cache_ttl_s,
        )

    @property
    def is_live(self) -> bool:
        """Whether the invalidation channel is followed (only then is anything cached)."""
        return self._live

    async def revoke(self, jti: str, *, ttl_s: int) -> None:
        await self._source.revoke(jti, ttl_s=ttl_s)
        await self.invalidate(jti)

    async def is_revoked(self, jti: str) -> bool:
        hit = self._answers.get(jti)
        if hit is not None and hit[1] > self._clock():
            return hit[0]
        generation = self._generation
        if not (self._live and self._ttl > 0):
            return await self._source.is_revoked(jti)
        reading = self._reading.get(jti)
        if reading is not None and reading[0] == generation:
            try:
                return await asyncio.shield(reading[1])
            except asyncio.CancelledError:
                if not reading[1].cancelled():
                    raise  # this check was cancelled, not the read it waited for
            return await self.is_revoked(jti)  # that read's caller gave up: read anew
        answer = await self._read(jti, generation)
        if self._live and generation == self._generation:
            if len(self._answers) >= self._max:
                self._answers.clear()
            self._answers[jti] = (answer, self._clock() + self._ttl)
        return answer

    async def _read(self, jti: str, generation: int) -> bool:
        """Ask the source, letting checks of the same generation wait for the answer."""
        shared: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        shared.add_done_callback(_retrieved)
        self._reading[jti] = (generation, shared)
        try:
            answer = await self._source.is_revoked(jti)
        except asyncio.CancelledError:
            shared.cancel()
            raise
        except Exception as exc:
            shared.set_exception(exc)
            raise
        finally:
            if self._reading.get(jti) == (generation, shared):
                del self._reading[jti]
        shared.set_result(answer)
        return answer

    async def listen(
        self,
        redis: Redis,
        stop: asyncio.Event,
        *,
        channel: str = REVOCATIONS_CHANNEL,
        subscribed: asyncio.Event | None = None,
    ) -> None:
        """Follow :data:`REVOCATIONS_CHANNEL` until ``stop`` is set (a background job)."""
        await run_invalidation_listener(redis, channel, self, stop, subscribed=subscribed)

    def after_subscribe(self) -> None:
        self._forget_all()
        self._live = True

    def after_connection_lost(self) -> None:
        self._live = False
        self._forget_all()

    async def invalidate(self, key: str) -> None:
        """``key`` (a ``jti``) was revoked: the next check reads the source."""
        self._generation += 1
        self._answers.pop(key, None)
        for woken in self._watches.get(key, ()):
            woken.set()

    @contextlib.contextmanager
    def watch(self, jti: str) -> Iterator[asyncio.Event]:
        """An event set when ``jti``'s revocation is announced while the block runs.

        It is also set whenever the subscription goes live or is lost (announcements
        may have been missed): a watcher that wakes checks :meth:`is_revoked` again.
        """
        woken = asyncio.Event()
        self._watches.setdefault(jti, set()).add(woken)
        try:
            yield woken
        finally:
            watching = self._watches.get(jti)
            if watching is not None:
                watching.discard(woken)
                if not watching:
                    del self._watches[jti]

    def _forget_all(self) -> None:
        self._generation += 1
        self._answers.clear()
        for watching in self._watches.values():
            for woken in watching:
                woken.set()


def _retrieved(read: asyncio.Future[bool]) -> None:
    """Mark a shared read's error as seen (its own caller raises it)."""
    if not read.cancelled():
        read.exception()


async def ensure_not_revoked(revocations: RevocationList, capability: Capability) -> None:
    """:class:`PermissionDenied` when the verified token has been revoked."""
    if await revocations.is_revoked(capability.jti):
        raise PermissionDenied("capability token has been revoked")


async def ensure_grant_not_revoked(revocations: RevocationList, grant: ExecutionGrant) -> None:
    """:class:`PermissionDenied` when the token a grant was minted for has been revoked since.

    Raises:
        PermissionDenied: the grant's ``cap_jti`` is revoked.
        RedisError: the revocation list is unreachable (retry; never run unchecked).
    """
    if await revocations.is_revoked(grant.capability_jti):
        raise PermissionDenied("the capability token behind this execution grant has been revoked")
