"""Redis client from ``TOOLFLEET_REDIS_URL``, and coalescing of concurrent commands."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline

from toolfleet.coalescing import Coalescer


def connect_redis(url: str, *, max_connections: int = 64, wait_s: float = 30.0) -> Redis:
    """A client whose pool waits for a free connection instead of failing under load."""
    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=wait_s, health_check_interval=30
    )
    return Redis(connection_pool=pool, decode_responses=False)


Command = Callable[[Pipeline], Any]
"""Queues one command on a pipeline (``lambda pipe: pipe.exists(key)``)."""


class CoalescedCommands:
    """Sends the commands many tasks issue at once in one round trip.

    A command issued while another batch is on the wire goes out with the others in the
    next pipeline (not a transaction: the commands are independent). Each caller gets
    its own command's reply, or the error that failed the round trip.
    """

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._batches: Coalescer[Command, Any] = Coalescer(self._send)

    async def run(self, command: Command) -> Any:
        """Queue ``command`` and return its reply once its batch was answered."""
        return await self._batches.submit(command)

    async def _send(self, commands: Sequence[Command]) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        for command in commands:
            command(pipe)
        replies: list[Any] = await pipe.execute()
        return replies
