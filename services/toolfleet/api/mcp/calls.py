"""Following an MCP call to its end, and finding it again to cancel it.

:func:`follow` reads the status projection until the invocation finishes, waits for
approval, or the wait runs out; status's finished notice wakes it at once, and it polls
in between (with backoff) for progress and ``pending_approval``, which have no notice.
Everything lives in Postgres and Redis, so any API replica can serve any request.

A client of the handshake era cancels with a separate ``notifications/cancelled`` POST
naming its JSON-RPC request id, which may reach another replica: :class:`CallIndex`
remembers which invocation a token's request started (Redis, with a TTL).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from redis.asyncio import Redis

from toolfleet.contract.http import InvocationView
from toolfleet.contract.progress import EventKind, view_events
from toolfleet.events.models import InvocationStatus
from toolfleet.storage.notices import FinishedNotices

Read = Callable[[], Awaitable[InvocationView | None]]
"""Reads the invocation's current view (``None`` until status has projected it)."""
OnProgress = Callable[[InvocationView], Awaitable[None]]
"""Called with each view that shows a new checkpoint (the reading the SSE route shares,
:func:`toolfleet.contract.progress.view_events`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FollowInput:
    """One call to follow."""

    invocation_id: str
    wait_s: float
    """Give up (answer with a handle) after this long."""
    first_poll_s: float = 0.05
    max_poll_s: float = 1.0
    """Polls start at ``first_poll_s`` and double up to this."""


async def follow(
    call: FollowInput, read: Read, notices: FinishedNotices, on_progress: OnProgress
) -> InvocationView | None:
    """The invocation's view once it has finished or waits for approval; ``None`` if it
    still runs after ``call.wait_s`` (or was never projected)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + call.wait_s
    poll_s = call.first_poll_s
    latest: InvocationView | None = None
    with notices.watch(call.invocation_id) as finished:
        while True:
            finished.clear()  # before reading: a notice during the read wakes the next wait
            view = await read()
            if view is not None:
                if view.status.is_terminal or view.status is InvocationStatus.PENDING_APPROVAL:
                    return view
                if EventKind.PROGRESS in view_events(latest, view):
                    await on_progress(view)
                    poll_s = call.first_poll_s  # it is moving: look again soon
                latest = view
            remaining = deadline - loop.time()
            if remaining <= 0:
                return latest
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), min(poll_s, remaining))
            poll_s = min(poll_s * 2, call.max_poll_s)


class CallIndex(Protocol):
    """Which invocation an MCP request of a token started."""

    async def remember(self, key: str, invocation_id: UUID, *, ttl_s: float) -> None: ...

    async def recall(self, key: str) -> UUID | None: ...


def call_key(jti: str, request_id: str | int) -> str:
    """The index key of one JSON-RPC request of one token."""
    return f"mcp:call:{jti}:{type(request_id).__name__}:{request_id}"


class RedisCallIndex:
    """:class:`CallIndex` in Redis, shared by every API replica."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def remember(self, key: str, invocation_id: UUID, *, ttl_s: float) -> None:
        await self._redis.set(key, str(invocation_id), ex=max(1, int(ttl_s)))

    async def recall(self, key: str) -> UUID | None:
        raw = await self._redis.get(key)
        if raw is None:
            return None
        return UUID(raw.decode() if isinstance(raw, bytes) else str(raw))


class MemoryCallIndex:
    """In-memory twin of :class:`RedisCallIndex` (one process; no expiry)."""

    def __init__(self) -> None:
        self.calls: dict[str, UUID] = {}

    async def remember(self, key: str, invocation_id: UUID, *, ttl_s: float) -> None:
        self.calls[key] = invocation_id

    async def recall(self, key: str) -> UUID | None:
        return self.calls.get(key)
