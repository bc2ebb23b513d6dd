"""Readiness: can this API reach the broker, Redis and Postgres right now?

Each check is cheap (a TCP connect, a ``PING``, a ``SELECT 1``) and bounded by a short
timeout, so a probe never hangs on a dead dependency.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

import asyncpg
from redis.asyncio import Redis

from toolfleet.api.resources import ApiResources
from toolfleet.api.settings import ApiSettings
from toolfleet.storage.redis import connect_redis


async def _kafka_reachable(bootstrap: str) -> None:
    """Succeeds if any bootstrap broker accepts a TCP connection."""
    last: OSError | None = None
    for address in (a.strip() for a in bootstrap.split(",") if a.strip()):
        host, _, port = address.rpartition(":")
        try:
            _, writer = await asyncio.open_connection(host.strip("[]") or "127.0.0.1", int(port))
        except OSError as exc:
            last = exc
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return
    raise last or OSError("no bootstrap address configured")


async def _redis_reachable(redis: Redis) -> None:
    await redis.ping()


async def _postgres_reachable(pool: asyncpg.Pool) -> None:
    await pool.fetchval("SELECT 1")


async def _redis_url_reachable(url: str) -> None:
    redis = connect_redis(url)
    try:
        await redis.ping()
    finally:
        await redis.aclose()


async def _postgres_dsn_reachable(dsn: str, timeout: float) -> None:
    conn = await asyncpg.connect(dsn, timeout=timeout)
    await conn.close()


async def _check(probe: Awaitable[None], timeout: float) -> str:
    try:
        await asyncio.wait_for(probe, timeout)
    except TimeoutError:
        return "timeout"
    except Exception:  # any failure means "not ready"; the kind does not matter here
        return "unreachable"
    return "ok"


_NAMES = ("kafka", "redis", "postgres")


async def check_dependencies(res: ApiResources) -> dict[str, str]:
    """``{"kafka": ..., "redis": ..., "postgres": ...}``, each ``ok`` or why not.

    Uses the running app's own clients, so it tests what requests will use.
    """
    timeout = res.settings.readiness_timeout_s
    results = await asyncio.gather(
        _check(_kafka_reachable(res.settings.kafka_bootstrap), timeout),
        _check(_redis_reachable(res.redis), timeout),
        _check(_postgres_reachable(res.pool), timeout),
    )
    return dict(zip(_NAMES, results, strict=True))


async def preflight(settings: ApiSettings, *, timeout: float = 3.0) -> dict[str, str]:
    """The same checks with fresh connections, before the app starts (``toolfleet api``)."""
    results = await asyncio.gather(
        _check(_kafka_reachable(settings.kafka_bootstrap), timeout),
        _check(_redis_url_reachable(settings.redis_url), timeout),
        _check(_postgres_dsn_reachable(settings.database_url, timeout), timeout),
    )
    return dict(zip(_NAMES, results, strict=True))
