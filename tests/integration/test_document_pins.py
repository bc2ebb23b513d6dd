"""Document pins in Redis and Postgres: a resume after Redis lost them keeps the versions."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from toolfleet.documents.pins import TieredPinBook, pins_key
from toolfleet.events.identity import CallKey
from toolfleet.storage.postgres import create_pool
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration


async def test_pins_survive_the_loss_of_redis(database_url: str, redis_url: str) -> None:
    pool = await create_pool(database_url)
    redis = connect_redis(redis_url)
    try:
        book = TieredPinBook(redis, pool, ttl_s=60)
        call = CallKey(tenant_id="t1", invocation_id=str(uuid.uuid4()))
        assert await book(call).pin("handbook", "1") == "1"
        assert await book(call).pin("handbook", "2") == "1"  # the first read's version holds
        await redis.delete(pins_key(call))  # Redis lost the hot copy (restart, eviction)

        resumed = book(call)
        assert await resumed.get("handbook") == "1"
        assert await resumed.pin("handbook", "2") == "1"
        assert await redis.hget(pins_key(call), "handbook") in (b"1", "1")  # warmed again
        assert await book(replace(call, invocation_id=str(uuid.uuid4()))).get("handbook") is None
        # A call is (tenant, invocation): another tenant's call of the same id has its own
        # pins, in Redis and in Postgres, and fixes nothing of this one's.
        theirs = replace(call, tenant_id="t2")
        assert await book(theirs).get("handbook") is None
        assert await book(theirs).pin("handbook", "9") == "9"
        await redis.delete(pins_key(call), pins_key(theirs))
        assert await book(call).get("handbook") == "1"
    finally:
        await redis.aclose()
        await pool.close()
