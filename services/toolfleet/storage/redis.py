"""Redis client from ``TOOLFLEET_REDIS_URL``, and coalescing of concurrent commands."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

import hiredis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError

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

        packed = _PACKED[base] = type(
            base.__name__, (base,), {"pack_command": pack_command, "check_health": check_health}
        )
    return packed


_UTF8 = frozenset({"utf-8", "utf8"})
_PACKED: dict[type[AbstractConnection], type[AbstractConnection]] = {}


Command = Callable[[Pipeline], Any]
"""Queues one command on a pipeline (``lambda pipe: pipe.exists(key)``)."""
_Item = tuple[Command, Command | None]


class RedisBatches:
    """Every command and script call the tasks of a process make on one client at about
    the same time, sent as one pipeline (not a transaction: they are independent).

    One per client (:func:`batches_of`), shared by every store of the process: a call
    goes through several stores (an executor's cancel flags, agent slots, leases,
    revocation list ...), and one batcher per store sent a pipeline for each of them
    where one does. A command issued while a batch is on the wire goes out with the
    others in the next one. Each caller gets its own reply or error; an error of the
    round trip itself fails every command of the batch.
    """

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._batches: Coalescer[_Item, Any] = Coalescer(self._send)

    async def run(self, command: Command, *, on_noscript: Command | None = None) -> Any:
        """Queue ``command`` and return its reply once its batch was answered;
        ``on_noscript`` is sent in its place when the reply is ``NOSCRIPT`` (a script
        called by SHA1 on a server that lacks it: ``EVAL`` with its source)."""
        return await self._batches.submit((command, on_noscript))

    async def _send(self, items: Sequence[_Item]) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        for command, _ in items:
            command(pipe)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        again = [
            (i, resend)
            for i, ((_, resend), reply) in enumerate(zip(items, replies, strict=True))
            if resend is not None and isinstance(reply, NoScriptError)
        ]
        if again:  # a server that lost its script cache: EVAL caches them again
            pipe = self._redis.pipeline(transaction=False)
            for _, resend in again:
                resend(pipe)
            replies_again = await pipe.execute(raise_on_error=False)
            for (i, _), reply in zip(again, replies_again, strict=True):
                replies[i] = reply
        return replies


def batches_of(redis: Redis) -> RedisBatches:
    """The client's :class:`RedisBatches` (made at its first use)."""
    found = _BATCHES.get(redis)
    if found is None:
        # A proxy: the batcher, a value of the weak map, must not keep its key alive.
        found = _BATCHES[redis] = RedisBatches(cast(Redis, weakref.proxy(redis)))
    return found


#: One batcher per client: a client lives on one event loop, and so does its batcher.
_BATCHES: weakref.WeakKeyDictionary[Redis, RedisBatches] = weakref.WeakKeyDictionary()


class CoalescedCommands:
    """A store's handle on its client's :class:`RedisBatches`: the commands many tasks
    issue at once go out in one round trip, with the other stores' of the process."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._batches: RedisBatches | None = None  # found at the first command

    async def run(self, command: Command) -> Any:
        """Queue ``command`` and return its reply once its batch was answered."""
        if self._batches is None:
            self._batches = batches_of(self._redis)
        return await self._batches.run(command)
