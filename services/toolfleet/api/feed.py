"""The live feed of invocation changes behind the console's list and the event streams.

A trigger on ``tool_invocations`` (migration 0009) sends each changed id on the
``tool_invocations_changed`` channel. One :class:`InvocationFeed` per API process holds
the only ``LISTEN`` connection, gathers the ids that arrive together, reads those rows
once, and hands each to every subscriber allowed to see its tenant. A subscriber that
falls behind, and every subscriber after the listener lost its connection (notices
sent meanwhile are gone), gets :data:`RESYNC`: reload the list, then follow again.

A row is a call, ``(tenant_id, invocation_id)``: the payload names the id alone, so the
feed reads every tenant's row of that id and offers each to its own tenant's
subscribers (and admins) only.

A read waiting for one call's row to appear (:mod:`toolfleet.api.appearing`) does not
subscribe to the rows: it awaits its id (:meth:`InvocationFeed.awaiting`), and a notice
naming that id wakes it, and it alone, with no row read by the feed: the reader reads
again with its own tenant scope. So a notice costs the waiters of its id, not every
waiter, and a backlog that keeps many reads waiting does not multiply the feed's work.
A notice of another tenant's call of the same id wakes the reader too; it reads
nothing it may not see, and its wait goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final
from uuid import UUID

from toolfleet.contract.http import InvocationView
from toolfleet.storage.errors import POSTGRES_FAILURES
from toolfleet.storage.pg_listen import first_set, listen_postgres

log = logging.getLogger(__name__)

CHANNEL: Final = "tool_invocations_changed"
"""The ``NOTIFY`` channel of migration 0009's trigger; each payload is one invocation id."""

RESYNC: Final = "resync"
"""Queued instead of a view when a subscriber may have missed changes."""

Item = InvocationView | str
ReadMany = Callable[[Sequence[UUID]], Awaitable[list[InvocationView]]]


@dataclass(eq=False, kw_only=True)
class Subscription:
    """One follower (an SSE response): its tenant scope and its queue."""

    tenant_id: str | None
    """Only this tenant's changes; ``None``: every tenant (admin)."""
    queue: asyncio.Queue[Item] = field(default_factory=lambda: asyncio.Queue(maxsize=512))

    def offer(self, item: Item) -> None:
        if isinstance(item, InvocationView) and self.tenant_id not in (None, item.tenant_id):
            return
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            # Too slow to follow: drop what waits, tell it to reload instead.
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(RESYNC)


@dataclass(kw_only=True)
class InvocationFeed:
    """Fans changed invocation rows out to subscribers."""

    read_many: ReadMany
    """Reads the current rows of some ids (every tenant; subscribers filter)."""
    gather_s: float = 0.05
    """After the first notice, how long to collect more before reading: the projection
    commits a batch of events at once."""
    _subscribers: set[Subscription] = field(default_factory=set)
    _awaiting: dict[UUID, set[asyncio.Event]] = field(default_factory=dict)
    _pending: set[UUID] = field(default_factory=set)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)

    @contextlib.contextmanager
    def subscribe(self, tenant_id: str | None) -> Iterator[Subscription]:
        """Follow changes visible to ``tenant_id`` (``None``: all) while the block runs."""
        subscription = Subscription(tenant_id=tenant_id)
        self._subscribers.add(subscription)
        try:
            yield subscription
        finally:
            self._subscribers.discard(subscription)

    @contextlib.contextmanager
    def awaiting(self, invocation_id: UUID) -> Iterator[asyncio.Event]:
        """An event set whenever a notice names ``invocation_id`` (any tenant's call of
        that id), or the feed may have missed notices, while the block runs; the waiter
        clears it before it reads again."""
        changed = asyncio.Event()
        waiters = self._awaiting.setdefault(invocation_id, set())
        waiters.add(changed)
        try:
            yield changed
        finally:
            waiters.discard(changed)
            if not waiters:
                del self._awaiting[invocation_id]

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    @property
    def waiting(self) -> int:
        """Reads awaiting a call's row (:meth:`awaiting`)."""
        return sum(len(waiters) for waiters in self._awaiting.values())

    def notice(self, payload: str) -> None:
        """One ``NOTIFY`` payload (an invocation id) arrived."""
        try:
            invocation_id = UUID(payload)
        except ValueError:
            return
        for changed in self._awaiting.get(invocation_id, ()):
            changed.set()
        self._pending.add(invocation_id)
        self._wake.set()

    def resync(self) -> None:
        for subscription in list(self._subscribers):
            subscription.offer(RESYNC)
        for waiters in self._awaiting.values():
            for changed in waiters:
                changed.set()

    async def deliver(self) -> None:
        """Read the pending ids' rows and offer them to every subscriber."""
        ids, self._pending = sorted(self._pending), set()
        self._wake.clear()
        if not ids or not self._subscribers:
            return
        for view in await self.read_many(ids):
            for subscription in list(self._subscribers):
                subscription.offer(view)

    async def run(self, stop: asyncio.Event) -> None:
        """Deliver until ``stop``: wait for a notice, gather a moment, read, fan out."""
        while not stop.is_set():
            await first_set(stop, self._wake)
            if stop.is_set():
                return
            if self.gather_s:
                await asyncio.sleep(self.gather_s)
            try:
                await self.deliver()
            except POSTGRES_FAILURES as exc:
                log.warning("console feed read failed", extra={"error": type(exc).__name__})
                self.resync()

    async def listen(self, dsn: str, stop: asyncio.Event, *, max_backoff_s: float = 5.0) -> None:
        """Hold the ``LISTEN`` connection until ``stop``; reconnect with backoff."""

        async def notice(payload: str) -> None:
            self.notice(payload)

        await listen_postgres(
            dsn,
            CHANNEL,
            notice,
            stop,
            after_listen=self.resync,  # anything may have changed while nobody listened
            max_backoff_s=max_backoff_s,
            what="console feed lost its connection; reconnecting",
        )
