"""Which executor pools have a live executor, as policy sees it when it authorizes a call.

Policy publishes every call on its pool's topic whatever it sees; what this decides is
whether the call is also announced ``queued`` (status shows it with its pool) and
indexed under its deadline, so that it ends ``timeout`` then if no executor of its pool
has started it (:mod:`toolfleet.storage.pools`). The view is a snapshot of the
executors' announcements, refreshed every :data:`REFRESH_S` by a background job: no
Redis round trip per call. Until the first refresh, and while Redis cannot be read,
every pool counts as served (a call is never announced queued on a guess).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from redis.exceptions import RedisError

from toolfleet.storage.pools import PoolPresence, live_counts

__all__ = ["REFRESH_S", "PoolLiveness"]

log = logging.getLogger(__name__)

REFRESH_S: Final = 1.0
"""How often the snapshot is refreshed (at most this stale, plus an executor's heartbeat)."""


class PoolLiveness:
    """Live executors per pool, as last read from their announcements."""

    def __init__(self, presence: PoolPresence) -> None:
        self._presence = presence
        self.counts: dict[str, int] | None = None
        """Pool -> live executors; None: not known (never read, or Redis unreachable)."""

    def is_served(self, pool: str) -> bool:
        """Whether an executor of ``pool`` is live (True while that is not known)."""
        return self.counts is None or self.counts.get(pool, 0) > 0

    async def refresh(self) -> None:
        """Read the announcements now; on a Redis failure the view becomes unknown."""
        try:
            self.counts = live_counts(await self._presence.live())
        except (RedisError, OSError) as exc:
            if self.counts is not None:
                log.warning("executor pools unknown: %s", type(exc).__name__)
            self.counts = None

    async def run(self, stop: asyncio.Event, *, interval_s: float = REFRESH_S) -> None:
        """Refresh every ``interval_s`` until ``stop``."""
        while not stop.is_set():
            await self.refresh()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
