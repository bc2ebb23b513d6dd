"""Notices that an invocation's outcome is in the status projection.

Status publishes the invocation id on :data:`FINISHED_CHANNEL` after the transaction
that stored a terminal outcome committed; the HTTP API's synchronous invoke waits on
it instead of polling Postgres. A notice says only "look again": a waiter always reads
the row itself, and rechecks now and then anyway, since pub/sub delivers at most once
(a notice sent while a subscriber reconnects is gone).

:class:`RedisFinishedNotices` is the Redis adapter, :class:`MemoryFinishedNotices` its
in-memory twin; both implement publish and :meth:`~FinishedNotices.watch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Final, Protocol, TypeVar

from redis.asyncio import Redis
from redis.exceptions import RedisError

from toolfleet.storage.pubsub import listen_with_reconnect

log = logging.getLogger(__name__)

T = TypeVar("T")

FINISHED_CHANNEL: Final = "invocation:finished"
"""Pub/sub channel; each message is the id of an invocation whose outcome is stored."""


class FinishedNotices(Protocol):
    """Publish and await "invocation finished" notices."""

    async def publish(self, invocation_id: str) -> None:
        """Tell every waiter that ``invocation_id``'s outcome is stored."""
        ...

    def watch(self, invocation_id: str) -> contextlib.AbstractContextManager[asyncio.Event]:
        """An event set by each notice for ``invocation_id`` while the block runs.

        Enter it *before* anything could finish the invocation, or its notice may pass.
        """
        ...


async def await_finished(
    read: Callable[[], Awaitable[T | None]],
    notice: asyncio.Event,
    *,
    timeout_s: float,
    recheck_s: float,
) -> T | None:
    """``read()`` once now, again on each notice and every ``recheck_s``, until it
    returns something (returned) or ``timeout_s`` has passed (``None``).

    ``notice`` comes from :meth:`FinishedNotices.watch`, entered before the work started.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        notice.clear()  # before reading: a notice during the read wakes the next wait
        found = await read()
        if found is not None:
            return found
        remaining = deadline - loop.time()
        if remaining <= 0:
            return None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(notice.wait(), min(recheck_s, remaining))


class _Waiters:
    """Events of the tasks waiting for each invocation, set when a notice names it."""

    def __init__(self) -> None:
        self._events: dict[str, set[asyncio.Event]] = {}

    @contextlib.contextmanager
    def watch(self, invocation_id: str) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        self._events.setdefault(invocation_id, set()).add(event)
        try:
            yield event
        finally:
            waiting = self._events.get(invocation_id)
            if waiting is not None:
                waiting.discard(event)
                if not waiting:
                    del self._events[invocation_id]

    def notify(self, invocation_id: str) -> None:
        for event in self._events.get(invocation_id, ()):
            event.set()


class MemoryFinishedNotices:
    """In-memory twin: notices reach the waiters of this process only."""

    def __init__(self) -> None:
        self._waiters = _Waiters()
        self.published: list[str] = []
        """Every id published, in order (tests)."""

    async def publish(self, invocation_id: str) -> None:
        self.published.append(invocation_id)
        self._waiters.notify(invocation_id)

    async def publish_all(self, invocation_ids: Sequence[str]) -> None:
        for invocation_id in invocation_ids:
            await self.publish(invocation_id)

    def watch(self, invocation_id: str) -> contextlib.AbstractContextManager[asyncio.Event]:
        return self._waiters.watch(invocation_id)


class RedisFinishedNotices:
    """Notices over Redis pub/sub. :meth:`listen` must run for :meth:`watch` to wake."""

    def __init__(self, redis: Redis, *, channel: str = FINISHED_CHANNEL) -> None:
        self._redis = redis
        self._channel = channel
        self._waiters = _Waiters()

    async def publish(self, invocation_id: str) -> None:
        """Publish; a Redis outage is logged, not raised (waiters recheck anyway)."""
        try:
            await self._redis.publish(self._channel, invocation_id)
        except (RedisError, OSError) as exc:
            log.warning("finished notice not sent", extra={"error": type(exc).__name__})

    async def publish_all(self, invocation_ids: Sequence[str]) -> None:
        """:meth:`publish` of each, in one round trip."""
        if not invocation_ids:
            return
        pipe = self._redis.pipeline(transaction=False)
        for invocation_id in invocation_ids:
            pipe.publish(self._channel, invocation_id)
        try:
            await pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("finished notices not sent", extra={"error": type(exc).__name__})

    def watch(self, invocation_id: str) -> contextlib.AbstractContextManager[asyncio.Event]:
        return self._waiters.watch(invocation_id)

    async def listen(
        self,
        stop: asyncio.Event,
        *,
        subscribed: Callable[[], None] | None = None,
        max_backoff_s: float = 5.0,
    ) -> None:
        """Wake waiters on every notice until ``stop`` is set; reconnect with backoff.

        Args:
            subscribed: called each time the subscription is live (tests wait on it).
        """

        async def notify(invocation_id: str) -> None:
            self._waiters.notify(invocation_id)

        await listen_with_reconnect(
            self._redis,
            self._channel,
            notify,
            stop,
            after_subscribe=subscribed,
            max_backoff_s=max_backoff_s,
        )
