"""One Redis pub/sub listener loop: subscribe, confirm, hand on each message, reconnect.

Every channel toolfleet listens on (cache invalidation, finished notices, traffic
announcements) needs the same loop: pub/sub delivers only to live subscribers, so the
listener must know when its subscription is live and when it was lost, and must come
back with backoff when Redis goes away. What differs is only what a message does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from toolfleet.storage.retrying import Backoff, UntilStopped

__all__ = ["SUBSCRIBE_TIMEOUT_S", "listen_with_reconnect"]

log = logging.getLogger(__name__)

SUBSCRIBE_TIMEOUT_S = 5.0
"""How long the server may take to confirm a subscription before the listener retries."""
_POLL_S = 0.5
"""How often a listener asks ``more_channels`` while they may still come: the first
:data:`_SETTLE_S` after its subscription, or after the last new one (consumers register
as they start)."""
_SETTLE_S = 10.0
_IDLE_POLL_S = 5.0
"""How long a settled listener waits for a message before it looks again (and lets
redis-py send its health-check ``PING`` when due). Every listener used to wake twice a
second: three of them were a fifth of an idle worker's wake-ups (bench/HISTORY.md,
eighteenth pass). ``stop`` does not wait for it: it cancels the listener."""


async def listen_with_reconnect(
    redis: Redis,
    channel: str,
    on_message: Callable[[str], Awaitable[None]],
    stop: asyncio.Event,
    *,
    after_subscribe: Callable[[], None] | None = None,
    after_connection_lost: Callable[[], None] | None = None,
    max_backoff_s: float = 5.0,
    more_channels: Callable[[], Collection[str]] | None = None,
    after_channel_subscribe: Callable[[str], None] | None = None,
) -> None:
    """Hand every message published on ``channel`` (as text) to ``on_message`` until
    ``stop`` is set, reconnecting with backoff when Redis goes away.

    Args:
        after_subscribe: called each time the server has confirmed the subscription
            (from then on no message is missed).
        after_connection_lost: called when the subscription is lost, and once more when
            the listener stops (or is cancelled): messages may be missed from then on.
        more_channels: further channels to listen on, asked after every message (and
            every half second): the ones it names anew are subscribed to.
        after_channel_subscribe: called with each of those once the server confirmed it.
    """
    reconnecting: UntilStopped[None] = UntilStopped(
        what="subscription lost; reconnecting",
        backoff=Backoff(first_s=0.1, max_s=max_backoff_s),
        retry_on=(RedisError, OSError),
        stop=stop,
        after_failure=lambda _exc: after_connection_lost() if after_connection_lost else None,
        log_extra={"channel": channel},
    )

    async def session() -> None:
        """One subscription, held until ``stop``; raises when it is lost."""
        pubsub = redis.pubsub()
        try:
            await pubsub.subscribe(channel)
            await _confirmed(pubsub)
            if after_subscribe is not None:
                after_subscribe()
            reconnecting.made_progress()
            asked: set[str] = set()
            loop = asyncio.get_running_loop()
            settled_at = loop.time() + _SETTLE_S
            while not stop.is_set():
                if more_channels is not None:
                    new = [c for c in more_channels() if c not in asked and c != channel]
                    if new:
                        asked.update(new)
                        await pubsub.subscribe(*new)
                        settled_at = loop.time() + _SETTLE_S
                settling = more_channels is not None and loop.time() < settled_at
                message = await pubsub.get_message(timeout=_POLL_S if settling else _IDLE_POLL_S)
                if message is None:
                    continue
                kind = message.get("type")
                if kind == "message":
                    await on_message(_text(message["data"]))
                elif kind == "subscribe" and after_channel_subscribe is not None:
                    after_channel_subscribe(_text(message["channel"]))
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # untyped in redis-py

    listening = asyncio.ensure_future(reconnecting.run(session))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([listening, stopped], return_when=asyncio.FIRST_COMPLETED)
        if listening.done():
            listening.result()  # what ended it (an error the retries do not cover)
    finally:
        stopped.cancel()
        if not listening.done():
            listening.cancel()  # stopped (or this task cancelled): the session closes
            with contextlib.suppress(asyncio.CancelledError):
                await listening
        if after_connection_lost is not None:
            after_connection_lost()


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
