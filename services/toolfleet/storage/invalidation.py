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
import contextlib
import logging
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

SUBSCRIBE_TIMEOUT_S = 5.0
"""How long the server may take to confirm a subscription before the listener retries."""
_POLL_S = 0.5


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
    backoff = 0.1
    try:
        while not stop.is_set():
            pubsub = redis.pubsub()
            try:
                await pubsub.subscribe(channel)
                await _confirmed(pubsub)
                target.after_subscribe()
                if subscribed is not None:
                    subscribed.set()
                backoff = 0.1
                while not stop.is_set():
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=_POLL_S
                    )
                    if message is not None and message.get("type") == "message":
                        key = _text(message["data"])
                        await target.invalidate(key)
                        log.debug("cache invalidated", extra={"channel": channel, "key": key})
            except (RedisError, OSError) as exc:
                target.after_connection_lost()
                if subscribed is not None:
                    subscribed.clear()
                log.warning(
                    "invalidation subscription lost; reconnecting",
                    extra={"channel": channel, "error": type(exc).__name__, "retry_in_s": backoff},
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=backoff)
                backoff = min(backoff * 2, max_backoff_s)
            finally:
                with contextlib.suppress(RedisError, OSError):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]  # untyped in redis-py
    finally:
        # Stopped (or cancelled): nobody invalidates any more, so nothing may be trusted.
        target.after_connection_lost()
        if subscribed is not None:
            subscribed.clear()


async def _confirmed(pubsub: PubSub) -> None:
    """Wait for the server's ``subscribe`` reply: only then are no messages missed."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SUBSCRIBE_TIMEOUT_S
    while loop.time() < deadline:
        message = await pubsub.get_message(timeout=_POLL_S)
        if message is not None and message.get("type") == "subscribe":
            return
    raise TimeoutError("the subscription was not confirmed")


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
