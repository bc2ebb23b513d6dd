"""The fleet's Redis client against the real Redis: no idle PING, same recovery."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.exceptions

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


async def test_a_command_redis_refuses_fails_alone_in_its_batch(redis_url: str) -> None:
    """Commands issued at once share a pipeline; the one Redis refuses gets its error, the
    others their replies."""
    client = connect_redis(redis_url)
    key = f"toolfleet:test:{uuid.uuid4().hex}"
    commands = CoalescedCommands(client)
    try:
        await client.set(key, b"text", ex=60)
        value, refused, length = await asyncio.gather(
            commands.run(lambda pipe: pipe.get(key)),
            commands.run(lambda pipe: pipe.hget(key, "field")),  # WRONGTYPE
            commands.run(lambda pipe: pipe.strlen(key)),
            return_exceptions=True,
        )
        assert value == b"text"
        assert isinstance(refused, redis.exceptions.ResponseError)
        assert length == 4
    finally:
        await client.delete(key)
        await client.aclose()
