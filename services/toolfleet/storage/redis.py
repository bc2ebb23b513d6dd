"""Redis client from ``TOOLFLEET_REDIS_URL``, and coalescing of concurrent commands."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline


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

    A consumer has hundreds of records in flight, and each asks Redis a small question
    (was this event seen?) at about the same time. Sent one by one, every question is
    a round trip and two syscalls; here a command issued while another batch is on the
    wire waits for it and goes out with the others in the next pipeline (not a
    transaction: the commands are independent). The first command of an idle client
    goes out on the next turn of the event loop. Each caller gets its own command's
    reply, or the error that failed the round trip.
    """

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._queued: list[tuple[Command, asyncio.Future[Any]]] = []
        self._sender: asyncio.Task[None] | None = None

    async def run(self, command: Command) -> Any:
        """Queue ``command`` and return its reply once its batch was answered."""
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queued.append((command, reply))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_batches())
        return await reply

    async def _send_batches(self) -> None:
        while self._queued:
            batch, self._queued = self._queued, []
            pipe = self._redis.pipeline(transaction=False)
            for command, _ in batch:
                command(pipe)
            try:
                replies = await pipe.execute()
            except Exception as exc:
                for _, reply in batch:
                    if not reply.done():
                        reply.set_exception(exc)
                continue
            for (_, reply), value in zip(batch, replies, strict=True):
                if not reply.done():
                    reply.set_result(value)
