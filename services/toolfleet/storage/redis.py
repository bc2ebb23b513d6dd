"""Redis client from ``TOOLFLEET_REDIS_URL``."""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis


def connect_redis(url: str, *, max_connections: int = 64, wait_s: float = 30.0) -> Redis:
    """A client whose pool waits for a free connection instead of failing under load."""
    pool = BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=wait_s, health_check_interval=30
    )
    return Redis(connection_pool=pool, decode_responses=False)
