"""Dedupe markers in the real Redis, asked for by many records at once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.exceptions
from redis.asyncio import Redis

from tests.support.counting_redis import CountingRedis, counting_redis
from toolfleet.bus.dedupe import RedisProcessedEvents

pytestmark = pytest.mark.integration

IN_FLIGHT = 200


@pytest.fixture
async def counting(redis_url: str) -> AsyncIterator[CountingRedis]:
    async with counting_redis(redis_url) as client:
        yield client


def event_keys(n: int) -> list[str]:
    run = uuid.uuid4().hex
    return [f"/toolfleet/policy:{run}-{i}" for i in range(n)]


async def test_records_in_flight_share_round_trips_and_get_their_own_answers(
    counting: CountingRedis,
) -> None:
    processed = RedisProcessedEvents(counting, group=f"g-{uuid.uuid4().hex[:8]}", ttl_s=60)
    keys = event_keys(IN_FLIGHT)
    marked, fresh = keys[::2], keys[1::2]
    await asyncio.gather(*(processed.mark(k) for k in marked))

    counting.round_trips = 0
    answers = await asyncio.gather(*(processed.seen(k) for k in keys))

    # The 200 questions asked at once went out together, not as 200 round trips.
    assert counting.round_trips <= 2
    assert answers == [k in marked for k in keys]
    assert not any([await processed.seen(k) for k in fresh])  # one at a time works too


async def test_the_marks_of_one_fetch_are_one_round_trip_and_its_questions_another(
    counting: CountingRedis,
) -> None:
    processed = RedisProcessedEvents(counting, group=f"g-{uuid.uuid4().hex[:8]}", ttl_s=60)
    keys = event_keys(IN_FLIGHT)
    marked = keys[::3]

    await processed.mark_all(event_keys(1))  # the server has the script from now on
    counting.round_trips = 0
    await processed.mark_all(marked)
    assert counting.round_trips == 1
    assert await processed.seen_all(keys) == [k in marked for k in keys]
    assert counting.round_trips == 2
    assert await processed.seen_all([]) == []
    await processed.mark_all([])
    assert counting.round_trips == 2  # nothing to ask or mark: no round trip


async def test_markers_expire_with_their_ttl(counting: CountingRedis) -> None:
    group = f"g-{uuid.uuid4().hex[:8]}"
    processed = RedisProcessedEvents(counting, group=group, ttl_s=60)
    await processed.mark("/toolfleet/policy:e1")
    ttls = [await counting.ttl(key) async for key in counting.scan_iter(f"dedupe:{group}:*")]
    assert len(ttls) == 1
    assert 0 < ttls[0] <= 60


async def test_a_failed_round_trip_fails_every_call_in_it() -> None:
    unreachable = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    processed = RedisProcessedEvents(unreachable, group="g", ttl_s=60)
    try:
        results = await asyncio.gather(
            *(processed.seen(k) for k in event_keys(20)), return_exceptions=True
        )
    finally:
        await unreachable.aclose()
    # Connection errors: the consumer runtime waits those out and asks again.
    assert all(isinstance(r, redis.exceptions.ConnectionError) for r in results), results


async def test_a_caller_that_gives_up_does_not_lose_the_others(counting: CountingRedis) -> None:
    processed = RedisProcessedEvents(counting, group=f"g-{uuid.uuid4().hex[:8]}", ttl_s=60)
    keys = event_keys(10)
    await processed.mark(keys[0])
    calls = [asyncio.create_task(processed.seen(k)) for k in keys]
    calls[3].cancel()
    answers = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(answers[3], asyncio.CancelledError)
    assert answers[:3] + answers[4:] == [True] + [False] * 8
