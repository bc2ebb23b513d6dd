"""Cache invalidation pushed to every process, one listener for every cache.

A writer commits to Redis (or Postgres), then publishes a key on a Redis channel; every
process running :func:`run_invalidation_listener` on that channel hands the key to its
cache, which drops it. The policy cache (``policy:updates``), the revocation cache
(``token:revocations``) and the executor's document cache listen this way. Where a
table has writers of every kind, a trigger sends the key instead (``NOTIFY``), and
:func:`run_postgres_invalidation_listener` hands it on the same way: the registry
caches of policy and the validator (``tool_versions_changed``, migration 0014;
:meth:`~toolfleet.registry.lookup.ToolLookup.listen`).

Pub/sub and ``NOTIFY`` deliver only to live listeners: a message published while a
listener is disconnected is lost. So a cache must not trust itself while its listener is down:
:meth:`InvalidationTarget.after_connection_lost` tells it so at once, and
:meth:`InvalidationTarget.after_subscribe` (called once the server confirmed the
subscription, on the first and on every later one) tells it that it may cache again,
after dropping whatever it held.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from redis.asyncio import Redis

from toolfleet.storage.pg_listen import listen_postgres
from toolfleet.storage.pubsub import listen_with_reconnect

log = logging.getLogger(__name__)


class InvalidationTarget(Protocol):
    """A per-process cache fed by a channel (``PolicyProvider``, ``CachedRevocationList``)."""

    def after_subscribe(self) -> None:
        """The subscription is live: drop everything (messages may have been missed)."""
        ...

    def after_connection_lost(self) -> None:
        """The subscription is gone: stop trusting cached entries until it is back."""
        ...

    async def invalidate(self, key: str) -> None:
        """A writer announced a change to ``key``."""
        ...


async def run_invalidation_listener(
    redis: Redis,
    channel: str,
    target: InvalidationTarget,
    stop: asyncio.Event,
    *,
    subscribed: asyncio.Event | None = None,
    max_backoff_s: float = 5.0,
) -> None:
    """Hand every key published on ``channel`` to ``target`` until ``stop`` is set.

    Reconnects with backoff when Redis goes away. ``target`` is told when the
    subscription goes live and when it is lost (also when the listener stops).

    Args:
        subscribed: set while the subscription is live (tests wait on it).
    """

    invalidate, live, lost = _handing_to(target, channel, subscribed)
    await listen_with_reconnect(
        redis,
        channel,
        invalidate,
        stop,
        after_subscribe=live,
        after_connection_lost=lost,
        max_backoff_s=max_backoff_s,
    )


async def run_postgres_invalidation_listener(
    dsn: str,
    channel: str,
    target: InvalidationTarget,
    stop: asyncio.Event,
    *,
    subscribed: asyncio.Event | None = None,
    max_backoff_s: float = 5.0,
) -> None:
    """As :func:`run_invalidation_listener`, for keys a Postgres trigger notifies on
    ``channel`` (a ``LISTEN`` of its own: :func:`~toolfleet.storage.pg_listen.listen_postgres`).

    A trigger hears every writer of its table, whoever it is; the notice goes out when
    the writing transaction commits.
    """
    invalidate, live, lost = _handing_to(target, channel, subscribed)
    await listen_postgres(
        dsn,
        channel,
        invalidate,
        stop,
        after_listen=live,
        after_connection_lost=lost,
        max_backoff_s=max_backoff_s,
        what="cache invalidation lost its connection; reconnecting",
    )


def _handing_to(
    target: InvalidationTarget, channel: str, subscribed: asyncio.Event | None
) -> tuple[Callable[[str], Awaitable[None]], Callable[[], None], Callable[[], None]]:
    """What a listener calls: on a key, once live, once lost."""

    async def invalidate(key: str) -> None:
        await target.invalidate(key)
        log.debug("cache invalidated", extra={"channel": channel, "key": key[:200]})

    def live() -> None:
        target.after_subscribe()
        if subscribed is not None:
            subscribed.set()

    def lost() -> None:
        target.after_connection_lost()
        if subscribed is not None:
            subscribed.clear()

    return invalidate, live, lost


class Generations:
    """Which cache reads may still be kept.

    A read takes a :meth:`token` before it starts and keeps its result only while the
    token is :meth:`current`: an invalidation of its key (:meth:`bump`), or of
    everything (:meth:`bump_all`), that came while it read means it may have read the
    value the invalidation replaced, and re-caching it would undo the invalidation.

    At most :attr:`MAX_KEYS` keys are remembered: past them a new key counts as an
    invalidation of everything (each read under way reads again). Whoever can publish
    on a channel can name keys by the million; that costs retries, never memory.
    """

    MAX_KEYS = 4096

    def __init__(self) -> None:
        self._epoch = 0
        self._of: dict[str, int] = {}

    def __len__(self) -> int:
        """Keys remembered (at most :attr:`MAX_KEYS`)."""
        return len(self._of)

    def token(self, key: str) -> tuple[int, int]:
        return self._epoch, self._of.get(key, 0)

    def current(self, key: str, token: tuple[int, int]) -> bool:
        return token == self.token(key)

    def bump(self, key: str) -> None:
        if key not in self._of and len(self._of) >= self.MAX_KEYS:
            self.bump_all()
        self._of[key] = self._of.get(key, 0) + 1

    def bump_all(self) -> None:
        self._epoch += 1
        self._of.clear()
