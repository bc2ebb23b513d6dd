"""Cache invalidation pushed over a Redis pub/sub channel, one listener for every cache.

A writer commits to Redis (or Postgres), then publishes a key on a channel; every
process running :func:`run_invalidation_listener` on that channel hands the key to its
cache, which drops it. The policy cache (``policy:updates``) and the revocation cache
(``token:revocations``) both listen this way.

Pub/sub delivers only to live subscribers: a message published while a listener is
disconnected is lost. So a cache must not trust itself while its listener is down:
:meth:`InvalidationTarget.after_connection_lost` tells it so at once, and
:meth:`InvalidationTarget.after_subscribe` (called once the server confirmed the
subscription, on the first and on every later one) tells it that it may cache again,
after dropping whatever it held.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from redis.asyncio import Redis

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

    async def invalidate(key: str) -> None:
        await target.invalidate(key)
        log.debug("cache invalidated", extra={"channel": channel, "key": key})

    def live() -> None:
        target.after_subscribe()
        if subscribed is not None:
            subscribed.set()

    def lost() -> None:
        target.after_connection_lost()
        if subscribed is not None:
            subscribed.clear()

    await listen_with_reconnect(
        redis,
        channel,
        invalidate,
        stop,
        after_subscribe=live,
        after_connection_lost=lost,
        max_backoff_s=max_backoff_s,
    )
