"""Test sessions never share a Redis database, even with an orphan of a killed one."""

from __future__ import annotations

import redis

from toolfleet.devstack.redis_claims import claimed_redis_database


def test_a_database_someone_is_still_connected_to_is_not_claimed(redis_server_url: str) -> None:
    with claimed_redis_database(redis_server_url) as first:
        orphan = redis.Redis.from_url(first)  # a worker of a session that was killed
        orphan.ping()
    # The first claim is released (its lock is gone), but the orphan still holds a
    # connection to that database: its approval sweeper would take our approvals.
    try:
        with claimed_redis_database(redis_server_url) as second:
            assert second != first
    finally:
        orphan.close()
