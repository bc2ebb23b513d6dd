"""Redis client from ``TOOLFLEET_REDIS_URL``, and coalescing of concurrent commands."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import hiredis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from toolfleet.coalescing import Coalescer


def connect_redis(url: str, *, max_connections: int = 64, wait_s: float = 30.0) -> Redis:
    """A client whose pool waits for a free connection instead of failing under load."""
    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=wait_s, health_check_interval=30
    )
    # from_url picked the class for the URL's scheme (TCP, TLS, Unix socket); hiredis
    # writes text as UTF-8, so a URL that asks for another encoding keeps redis-py's.
    if str(pool.connection_kwargs.get("encoding", "utf-8")).lower() in _UTF8:
        pool.connection_class = lean_connection(pool.connection_class)
    return Redis(connection_pool=pool, decode_responses=False)


def lean_connection(base: type[AbstractConnection]) -> type[AbstractConnection]:
    """``base`` whose commands hiredis packs and which sends no health-check ``PING``.

    Packing: redis-py parses replies with hiredis but packs every command in Python:
    about 16 us of CPU for a script call of a dozen arguments, most of what a pipelined
    command costs the client (``bench/PROFILE.md``, eleventh pass);
    ``hiredis.pack_command`` writes the same bytes in 2 us. What hiredis refuses (a
    memoryview, a value that is not text, bytes or a number) goes to redis-py's packer,
    which sends it or raises its own ``DataError`` as before.

    Health checks: with ``health_check_interval`` set, redis-py sends a ``PING`` and
    waits for it before the first command on a connection idle that long: one more
    round trip on every hop of the first call after a rest. Commands do not retry
    here (callers do), so the ``PING`` only moved the same ``ConnectionError`` earlier;
    a command on a connection Redis dropped fails as the ``PING`` would have, and is
    never executed. Pub/sub keeps its checks (``PubSub.check_health`` is its own):
    there a dead connection would otherwise stay silent.

    Writes: redis-py 8 bounds each write by ``socket_timeout`` with ``asyncio.wait_for``,
    which on Python 3.11 runs the write in a task of its own, one more task and loop
    pass per command or pipeline sent. ``asyncio.timeout`` bounds it the same way in the
    caller's task, as ``wait_for`` itself does from Python 3.12: an executor call
    3.37M -> 3.07M instructions at 8 calls in flight, where pipelines are short (0.5%
    fewer at 200, where each carries dozens; ``bench/PROFILE.md``, twenty-second pass).
    This copies redis-py's ``send_packed_command`` around its private write step
    (``_send_packed_command``: write, then drain) and keeps its outcomes: a write past
    the timeout raises redis-py's ``TimeoutError``, a socket error its
    ``ConnectionError`` with the same words, and either, or a cancellation mid-write,
    drops the connection.
    """
    packed = _PACKED.get(base)
    if packed is None:

        def pack_command(self: AbstractConnection, *args: Any) -> list[bytes]:
            name = args[0]
            if isinstance(name, str):  # "CONFIG GET" is two words on the wire
                args = (*name.encode().split(), *args[1:])
            elif b" " in name:
                args = (*name.split(), *args[1:])
            try:
                return [hiredis.pack_command(args)]
            except (TypeError, UnicodeError):
                return base.pack_command(self, *args)

        async def check_health(self: AbstractConnection) -> None:
            return None

        async def send_packed_command(
            self: AbstractConnection, command: Any, check_health: bool = True
        ) -> None:
            if not self.is_connected or not self.socket_timeout:  # redis-py connects first
                return await base.send_packed_command(self, command, check_health)
            if isinstance(command, str):
                command = command.encode()
            if isinstance(command, bytes):
                command = [command]
            try:
                async with asyncio.timeout(self.socket_timeout):
                    await self._send_packed_command(command)
            except TimeoutError:  # before OSError: TimeoutError is one
                await self.disconnect(nowait=True)
                raise RedisTimeoutError("Timeout writing to socket") from None
            except OSError as e:
                await self.disconnect(nowait=True)
                err_no, message = e.args[:2] if len(e.args) > 1 else ("UNKNOWN", e)
                raise RedisConnectionError(
                    f"Error {err_no} while writing to socket. {message}."
                ) from e
            except BaseException:  # cancelled mid-write: the stream is cut mid-command
                await self.disconnect(nowait=True)
                raise

        packed = _PACKED[base] = type(
            base.__name__,
            (base,),
            {
                "pack_command": pack_command,
                "check_health": check_health,
                "send_packed_command": send_packed_command,
            },
        )
    return packed


_UTF8 = frozenset({"utf-8", "utf8"})
_PACKED: dict[type[AbstractConnection], type[AbstractConnection]] = {}


Command = Callable[[Pipeline], Any]
"""Queues one command on a pipeline (``lambda pipe: pipe.exists(key)``)."""


class CoalescedCommands:
    """Sends the commands many tasks issue at once in one round trip.

    A command issued while another batch is on the wire goes out with the others in the
    next pipeline (not a transaction: the commands are independent). Each caller gets
    its own command's reply or error (a command Redis refuses fails alone), or the error
    that failed the round trip.
    """

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._batches: Coalescer[Command, Any] = Coalescer(self._send)

    async def run(self, command: Command) -> Any:
        """Queue ``command`` and return its reply once its batch was answered."""
        return await self._batches.submit(command)

    def send(self, command: Command) -> asyncio.Future[Any]:
        """Queue ``command`` now; its reply, once its batch was answered, is the future's."""
        return self._batches.enqueue(command)

    async def _send(self, commands: Sequence[Command]) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        for command in commands:
            command(pipe)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies
