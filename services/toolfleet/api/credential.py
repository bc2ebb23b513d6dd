"""Long responses end with the token that opened them.

A request is authorized once, when it arrives; a Server-Sent Events stream or a long
MCP call then goes on answering for as long as it runs. So each of them also waits for
its token to end (:meth:`CredentialWatch.ended`): at the token's ``exp``, or within a
second of its revocation, pushed by the ``token:revocations`` announcement that already
drops the revocation cache
(:meth:`~toolfleet.storage.revocation.CachedRevocationList.watch`).
A stream then sends a last ``stream_closed`` event naming the :class:`CloseReason` and
closes (:func:`until_credential_ends`); a long call answers with the reason instead of
its result (:func:`before_credential_ends`).

Without a live subscription (Redis away, a reconnect under way) announcements may be
lost: the watch then asks Redis every :attr:`CredentialWatch.offline_recheck_s`. While
Redis cannot be read no revocation can be stored either, so the watch keeps the
stream open and asks again; it never ends a stream on a guess.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Protocol, TypeVar

from redis.exceptions import RedisError

from toolfleet.auth.tokens import Capability

T = TypeVar("T")

STREAM_CLOSED: Final = "stream_closed"
"""Name of a stream's last event when its token ended (contract section 9)."""


class CloseReason(StrEnum):
    """Why a response ended before its natural end."""

    TOKEN_REVOKED = "token_revoked"  # noqa: S105 (a reason, not a secret)
    """The token was revoked while the response ran."""
    TOKEN_EXPIRED = "token_expired"  # noqa: S105 (a reason, not a secret)
    """The token's ``exp`` passed while the response ran."""

    @property
    def message(self) -> str:
        if self is CloseReason.TOKEN_REVOKED:
            return "the token of this stream was revoked; sign in again with a valid token"
        return "the token of this stream has expired; sign in again with a fresh token"


class RevocationWatch(Protocol):
    """Port: a revocation list that announces revocations (``CachedRevocationList``)."""

    @property
    def is_live(self) -> bool:
        """Whether announcements arrive (else the watch polls)."""
        ...

    def watch(self, jti: str) -> AbstractContextManager[asyncio.Event]:
        """An event set when ``jti``'s revocation may have been announced."""
        ...

    async def is_revoked(self, jti: str) -> bool: ...


@dataclass(frozen=True, kw_only=True)
class CredentialWatch:
    """Waits for a verified token to end: revoked, or past its ``exp``."""

    revocations: RevocationWatch
    clock: Callable[[], float] = time.time
    """Epoch seconds (tokens' ``exp`` is epoch seconds)."""
    recheck_s: float = 5.0
    """With a live subscription, how often the list is asked anyway: bounds a message
    lost on a connection that looks alive (the cache answers most of these)."""
    offline_recheck_s: float = 1.0
    """Without a live subscription (or while Redis fails), how often Redis is asked."""

    async def ended(self, capability: Capability) -> CloseReason:
        """Return once ``capability`` has ended, saying how."""
        with self.revocations.watch(capability.jti) as announced:
            while True:
                remaining = capability.expires_at - self.clock()
                if remaining <= 0:
                    return CloseReason.TOKEN_EXPIRED
                announced.clear()  # before reading: an announcement during it wakes the wait
                try:
                    if await self.revocations.is_revoked(capability.jti):
                        return CloseReason.TOKEN_REVOKED
                    live = self.revocations.is_live
                except (RedisError, OSError):
                    live = False  # nothing can be revoked while Redis is away: ask again
                wait_s = min(remaining, self.recheck_s if live else self.offline_recheck_s)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(announced.wait(), wait_s)


def closed_frame(reason: CloseReason) -> str:
    """The last SSE event of a stream whose token ended."""
    body = json.dumps({"reason": reason.value, "message": reason.message}, separators=(",", ":"))
    return f"event: {STREAM_CLOSED}\ndata: {body}\n\n"


async def until_credential_ends(
    frames: AsyncIterator[str], ended: Callable[[], Coroutine[Any, Any, CloseReason]]
) -> AsyncIterator[str]:
    """``frames`` until they end or ``ended()`` returns; then :func:`closed_frame`, and stop.

    The watch starts with the first frame. A frame is never sent once the token has
    ended, even one that was ready.
    """
    end = asyncio.ensure_future(ended())
    step: asyncio.Future[str] | None = None
    try:
        while True:
            step = asyncio.ensure_future(_next(frames))
            await asyncio.wait({step, end}, return_when=asyncio.FIRST_COMPLETED)
            if end.done():
                break
            try:
                frame = step.result()
            except StopAsyncIteration:
                return
            step = None
            yield frame
        reason = end.result()
        yield closed_frame(reason)
    finally:
        await _cancel(step, end)
        if isinstance(frames, AsyncGenerator):
            await frames.aclose()  # its own clean-up (a feed subscription) runs now


async def before_credential_ends(
    work: Coroutine[Any, Any, T], ended: Coroutine[Any, Any, CloseReason]
) -> T | CloseReason:
    """What ``work`` returns, or the :class:`CloseReason` if the token ends first (then
    ``work`` is cancelled). A cancel of the caller cancels both."""
    job = asyncio.ensure_future(work)
    end = asyncio.ensure_future(ended)
    try:
        await asyncio.wait({job, end}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the caller was cancelled: so is everything it started
        await _cancel(job, end)
        raise
    if end.done():
        await _cancel(job)
        return end.result()
    await _cancel(end)
    return job.result()


async def _next(frames: AsyncIterator[str]) -> str:
    return await anext(frames)


async def _cancel(*tasks: asyncio.Future[Any] | None) -> None:
    """Cancel what still runs and wait for it (which also retrieves what failed)."""
    dropped = [t for t in tasks if t is not None]
    for task in dropped:
        task.cancel()
    await asyncio.gather(*dropped, return_exceptions=True)
