"""The fleet's Redis client against the real Redis: no idle PING, same recovery."""

from __future__ import annotations

import uuid

import pytest
import redis.exceptions

from toolfleet.storage.redis import connect_redis

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
