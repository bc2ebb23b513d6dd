"""The fleet's Redis client against the real Redis: no idle PING, same recovery, and one
round trip for what the stores of a process send at once."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis.exceptions

from toolfleet.events.identity import CallKey
from toolfleet.storage.cancel_flags import RedisCancelFlags
from toolfleet.storage.lua import LuaScript
from toolfleet.storage.redis import CoalescedCommands, connect_redis

pytestmark = pytest.mark.integration


async def test_a_connection_redis_dropped_fails_its_command_and_the_next_reconnects(
    redis_url: str,
) -> None:
    client = connect_redis(redis_url, max_connections=1)
    admin = connect_redis(redis_url)
    key = f"toolfleet:test:{uuid.uuid4().hex}"
    try:
        await client.set(key, b"before", ex=60)
        client_id = await client.client_id()
        assert await admin.client_kill_filter(_id=client_id) == 1
        # The one pooled connection is dead: the write is refused, not half done.
        with pytest.raises(redis.exceptions.ConnectionError):
            await client.set(key, b"lost", ex=60)
        assert await admin.get(key) == b"before"
        # The next command connects again (callers retry a ConnectionError).
        await client.set(key, b"after", ex=60)
        assert await client.get(key) == b"after"
    finally:
        await admin.delete(key)
        await client.aclose()
        await admin.aclose()


async def test_the_stores_of_a_process_share_a_round_trip_and_fail_alone(redis_url: str) -> None:
    """A cancel flag read, a script call and two plain commands issued at once by
    different stores go out in one pipeline; the command Redis refuses fails alone."""
    client = connect_redis(redis_url)
    pipelines: list[int] = []
    make_pipeline = client.pipeline

    def counted(*args: Any, **kwargs: Any) -> Any:
        pipelines.append(1)
        return make_pipeline(*args, **kwargs)

    client.pipeline = counted  # type: ignore[method-assign]
    key = f"toolfleet:test:{uuid.uuid4().hex}"
    try:
        await client.set(key, b"text", ex=60)
        echo = LuaScript("echo_test", source="return {KEYS[1], ARGV[1]}")
        await echo(client, [key], ["cached"])  # the server has it: no NOSCRIPT round trip
        pipelines.clear()
        flag, echoed, value, refused = await asyncio.gather(
            RedisCancelFlags(client).is_requested(
                CallKey(tenant_id="t1", invocation_id=str(uuid.uuid4()))
            ),
            echo(client, [key], ["a"]),
            CoalescedCommands(client).run(lambda pipe: pipe.get(key)),
            CoalescedCommands(client).run(lambda pipe: pipe.hget(key, "field")),  # WRONGTYPE
            return_exceptions=True,
        )
        assert len(pipelines) == 1
        assert flag is False
        assert echoed == [key.encode(), b"a"]
        assert value == b"text"
        assert isinstance(refused, redis.exceptions.ResponseError)
    finally:
        await client.delete(key)
        await client.aclose()
