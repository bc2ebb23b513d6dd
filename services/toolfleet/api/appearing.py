"""Waiting for a call that was accepted but is not in the status projection yet.

The projection trails a publish by a few milliseconds, so a read right after a ``202``
may find no row. :func:`appeared` waits for it without polling: it awaits the call's id
on the projection's notifications (:meth:`~toolfleet.api.feed.InvocationFeed.awaiting`)
before its first read, and reads again, with the caller's own tenant scope, whenever a
notice names that id, with a slow :attr:`AppearWait.fallback_s` read in case the feed is
down. The invocation routes wait only for a call the API accepted
(:mod:`toolfleet.storage.accepted`); the event stream waits for any id, so a call
published straight to Kafka can be followed too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Annotated
from uuid import UUID

from fastapi import Depends

from toolfleet.api.feed import InvocationFeed
from toolfleet.contract.http import InvocationView

APPEAR_WAIT_S = 5.0
"""How long an invocation not (yet) in the projection is awaited before the 404."""
APPEAR_FALLBACK_S = 1.0
"""While awaited, the projection is read again at least this often, should the feed
(the projection's notifications) be down."""

Read = Callable[[], Awaitable[InvocationView | None]]


@dataclass(frozen=True, kw_only=True)
class AppearWait:
    """How an invocation not (yet) in the projection is awaited (:func:`appear_wait`)."""

    wait_s: float = APPEAR_WAIT_S
    """The whole wait before the 404."""
    fallback_s: float = APPEAR_FALLBACK_S
    """The longest pause between two reads when no notification comes."""


def appear_wait() -> AppearWait:
    """The routes' wait; a dependency, so a test may shorten it."""
    return AppearWait()


AppearWaitDep = Annotated[AppearWait, Depends(appear_wait)]


Pause = Callable[[float], Awaitable[None]]


async def first_view(
    read: Read,
    *,
    wait_s: float = APPEAR_WAIT_S,
    fallback_s: float = APPEAR_FALLBACK_S,
    pause: Pause = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    read_first: bool = True,
) -> InvocationView | None:
    """The invocation's first view, awaited for up to ``wait_s`` while the projection has
    no row for it (``None``: still none, a 404).

    ``pause(seconds)`` returns after ``seconds`` or sooner, once the call may have
    changed (:func:`waking`); each return is one more read. The wait ends at
    ``wait_s`` by ``clock`` whatever the id, so a missing and a hidden id look alike.
    ``read_first``: False when the caller has just read and found no row (the wait then
    starts with a pause).
    """
    deadline = clock() + wait_s
    view = await read() if read_first else None
    while view is None:
        left = deadline - clock()
        if left <= 0:
            break
        await pause(min(fallback_s, left))
        view = await read()
    return view


@contextlib.contextmanager
def waking(feed: InvocationFeed, invocation_id: UUID) -> Iterator[Pause]:
    """A :func:`first_view` pause that the feed's notices of ``invocation_id`` end early,
    awaited from the start of the block: a row written after a read in the block still
    wakes the next pause. A notice of another tenant's call of the same id wakes it too,
    but the read after it finds nothing the caller may not see, and the wait goes on to
    its end like a missing id's."""
    with feed.awaiting(invocation_id) as changed:

        async def pause(seconds: float) -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await changed.wait()
            changed.clear()  # before the read: a notice during it wakes the next pause

        yield pause


async def appeared(
    feed: InvocationFeed,
    read: Read,
    invocation_id: UUID,
    *,
    wait: AppearWait,
) -> InvocationView | None:
    """``read()``'s view once the projection has the call, awaited up to ``wait.wait_s``
    (:func:`waking`, from before the first read)."""
    with waking(feed, invocation_id) as pause:
        return await first_view(read, wait_s=wait.wait_s, fallback_s=wait.fallback_s, pause=pause)
