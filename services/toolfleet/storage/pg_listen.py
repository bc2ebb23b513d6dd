"""One Postgres ``LISTEN`` loop: listen, hand on each notice, check the line, reconnect.

Postgres's ``NOTIFY`` reaches only live listeners, as Redis pub/sub does
(:mod:`toolfleet.storage.pubsub`): a listener must know when it listens and when it
lost its connection, and must come back with backoff. Two listen here: the console's
feed of changed invocations, and the registry caches of policy and the validator,
which a trigger on ``tool_versions`` tells of every change (migration 0014).

The connection is its own, never a pooled one: pool connections are released without a
reset, so a ``LISTEN`` must not live on one (:mod:`toolfleet.storage.postgres`). A
peer that vanished without closing the socket (a cut network) would leave the listener
deaf and unaware, so it runs ``SELECT 1`` on its line every ``check_every_s``: one round
trip a minute keeps a stale cache bounded by that, not by the next restart.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Final

import asyncpg

from toolfleet.storage.errors import POSTGRES_FAILURES
from toolfleet.storage.retrying import Backoff, UntilStopped

__all__ = ["first_set", "listen_postgres"]

CHECK_EVERY_S: Final = 60.0
"""How often an idle listener makes sure its connection still answers."""
CHECK_TIMEOUT_S: Final = 10.0


async def listen_postgres(
    dsn: str,
    channel: str,
    on_notice: Callable[[str], Awaitable[None]],
    stop: asyncio.Event,
    *,
    after_listen: Callable[[], None] | None = None,
    after_connection_lost: Callable[[], None] | None = None,
    max_backoff_s: float = 5.0,
    check_every_s: float = CHECK_EVERY_S,
    check_timeout_s: float = CHECK_TIMEOUT_S,
    what: str = "LISTEN connection lost; reconnecting",
) -> None:
    """Hand every payload notified on ``channel`` to ``on_notice`` until ``stop`` is set,
    reconnecting with backoff when Postgres goes away.

    Notices are handed on one at a time, in the order they came.

    Args:
        after_listen: called each time ``LISTEN`` took effect (from then on no notice
            is missed).
        after_connection_lost: called when the connection is lost, and once more when
            the listener stops (or is cancelled): notices may be missed from then on.
        check_every_s: how often the line is checked (``SELECT 1``) ...
        check_timeout_s: ... and how long its answer may take before the connection is
            taken for lost.
        what: the warning logged on each reconnect (no DSN, ever).
    """
    reconnecting: UntilStopped[None] = UntilStopped(
        what=what,
        backoff=Backoff(first_s=0.2, max_s=max_backoff_s),
        retry_on=POSTGRES_FAILURES,  # a lost line is a ConnectionResetError: an OSError
        stop=stop,
        after_failure=lambda _exc: after_connection_lost() if after_connection_lost else None,
        log_extra={"channel": channel},
    )

    async def session() -> None:
        pending: deque[str] = deque()
        noticed, lost = asyncio.Event(), asyncio.Event()

        def notified(_conn: object, _pid: int, _channel: str, payload: object) -> None:
            pending.append(str(payload))
            noticed.set()

        conn = await asyncpg.connect(dsn)
        try:
            conn.add_termination_listener(lambda _conn: lost.set())
            await conn.add_listener(channel, notified)
            if after_listen is not None:
                after_listen()
            reconnecting.made_progress()
            loop = asyncio.get_running_loop()
            check_at = loop.time() + check_every_s
            while not stop.is_set():
                if lost.is_set():
                    raise ConnectionResetError("the LISTEN connection closed")
                while pending:
                    await on_notice(pending.popleft())
                noticed.clear()  # no await since the queue was found empty
                if loop.time() >= check_at:
                    await conn.fetchval("SELECT 1", timeout=check_timeout_s)
                    check_at = loop.time() + check_every_s
                    continue
                await first_set(stop, lost, noticed, timeout=check_at - loop.time())
        except TimeoutError:  # the line check went unanswered
            raise ConnectionResetError("the LISTEN connection does not answer") from None
        finally:
            with contextlib.suppress(asyncpg.PostgresError, OSError, TimeoutError):
                await conn.close(timeout=2)

    try:
        await reconnecting.run(session)
    finally:
        if after_connection_lost is not None:
            after_connection_lost()


async def first_set(*events: asyncio.Event, timeout: float | None = None) -> None:
    """Return once any of ``events`` is set, or after ``timeout`` seconds (None: no
    limit). The loop here and the console feed that reads its notices both wait so."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(
            waiters,
            timeout=None if timeout is None else max(0.0, timeout),
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        for waiter in waiters:
            waiter.cancel()
