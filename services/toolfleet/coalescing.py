"""Calls that many tasks make at about the same time, handled as one batch.

A consumer has hundreds of records in flight, and each makes the same small request at
about the same time: ask Redis whether its event was seen, project its event into
Postgres, record its call in a circuit. One by one, every request is a round trip (and
for a shared key, a race). A :class:`Coalescer` hands the requests made while a batch is
being handled to its handler as the next batch, so a busy consumer makes a few large
round trips and an idle one makes the same single round trip as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")

BatchHandler = Callable[[Sequence[In]], Awaitable[Sequence[Out | Exception]]]
"""Handles a batch; returns one result per item, or per item of a leading part of the
batch (the rest go into the next batch). An exception as a result is that item's error."""


class Coalescer(Generic[In, Out]):
    """Runs ``handle`` on the items submitted while its previous batch was handled.

    The first item of an idle coalescer starts a batch on the next turn of the event
    loop. Each caller gets its own item's result; if ``handle`` raises, every caller in
    the batch gets that error. A caller that stops waiting leaves the others unaffected.
    """

    def __init__(self, handle: BatchHandler[In, Out], *, max_batch: int = 1024) -> None:
        self._handle = handle
        self._max_batch = max_batch
        self._queued: list[tuple[In, asyncio.Future[Out]]] = []
        self._worker: asyncio.Task[None] | None = None

    async def submit(self, item: In) -> Out:
        """Queue ``item`` and return its result once its batch was handled."""
        return await self.enqueue(item)

    def enqueue(self, item: In) -> asyncio.Future[Out]:
        """Queue ``item`` now; its result, once its batch was handled, is the future's.
        (:meth:`submit` queues it only when awaited; this needs no task to be under way.)"""
        result: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._queued.append((item, result))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._run())
        return result

    async def _run(self) -> None:
        while self._queued:
            batch = self._queued[: self._max_batch]
            try:
                results = await self._handle([item for item, _ in batch])
                if not 0 < len(results) <= len(batch):
                    raise RuntimeError(f"{len(results)} results for a batch of {len(batch)}")
            except Exception as exc:
                del self._queued[: len(batch)]
                for _, waiting in batch:
                    _settle(waiting, exc)
                continue
            del self._queued[: len(results)]
            for (_, waiting), result in zip(batch, results, strict=False):
                _settle(waiting, result)


def _settle(waiting: asyncio.Future[Out], result: Out | Exception) -> None:
    if waiting.done():  # the caller stopped waiting
        return
    if isinstance(result, Exception):
        waiting.set_exception(result)
    else:
        waiting.set_result(result)


Key = TypeVar("Key")
Token = TypeVar("Token")


class SingleFlight(Generic[Key, Token, Out]):
    """Concurrent loads of one key share one read: the loads of a cache's misses.

    A cold cache meets a burst of calls of the same tenant or tool at once (a worker
    started under load): each miss read the store, several times the same row. A load
    under way is joined instead, as long as it started under the caller's ``token``
    (:class:`~toolfleet.storage.invalidation.Generations`): a caller that came after an
    invalidation of its key never takes a read from before it. The load runs in a task
    of its own: a caller that stops waiting leaves it to the others, and its error is
    every joiner's.
    """

    def __init__(self) -> None:
        self._flights: dict[Key, tuple[Token, asyncio.Future[Out]]] = {}

    async def run(self, key: Key, token: Token, load: Callable[[], Awaitable[Out]]) -> Out:
        flight = self._flights.get(key)
        if flight is None or flight[0] != token:
            task = asyncio.ensure_future(load())
            flight = self._flights[key] = (token, task)
            task.add_done_callback(lambda done: self._landed(key, done))
        return await asyncio.shield(flight[1])

    def _landed(self, key: Key, done: asyncio.Future[Out]) -> None:
        flight = self._flights.get(key)
        if flight is not None and flight[1] is done:
            del self._flights[key]
        if not done.cancelled():
            done.exception()  # seen: joiners that stopped waiting leave no warning
