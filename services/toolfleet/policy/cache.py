"""The Redis side of policy caching: the shared cache and ``policy:updates``.

``policy:cache:{tenant}`` is a hash holding the tenant's cached ``entry`` (JSON, see
:class:`~toolfleet.policy.provider.CachedEntry`) and an ``epoch`` counter, with a TTL
of :data:`CACHE_TTL_S`. A writer calls :meth:`RedisPolicyCache.announce` after
committing a change: it bumps the epoch, drops the entry and publishes the tenant id on
:data:`POLICY_UPDATES_CHANNEL`; every process running :func:`run_invalidation_listener`
then drops its own copy. Keeping entry and epoch in one key keeps the conditional write
a single-key script (cluster-safe).
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from toolfleet.policy.documents import TenantPolicy
from toolfleet.policy.provider import CachedEntry, PolicyProvider
from toolfleet.storage import invalidation
from toolfleet.storage.lua import LuaScript

log = logging.getLogger(__name__)

POLICY_UPDATES_CHANNEL = "policy:updates"
"""Pub/sub channel announcing a changed tenant policy; the message is the tenant id."""
CACHE_TTL_S = 300
"""Lifetime of a cached entry in Redis."""

# Store the entry only while the epoch is the one the reader saw before loading it.
_STORE_IF_EPOCH = LuaScript(
    "policy_cache_store",
    source="""
local current = redis.call('HGET', KEYS[1], 'epoch') or ''
if current ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'entry', ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
""",
)


def cache_key(tenant_id: str) -> str:
    return f"policy:cache:{tenant_id}"


class RedisPolicyCache:
    """:class:`~toolfleet.policy.provider.SharedPolicyCache` over Redis.

    Read and write failures are logged and treated as misses: Postgres still answers.
    """

    def __init__(
        self, redis: Redis, *, ttl_s: int = CACHE_TTL_S, channel: str = POLICY_UPDATES_CHANNEL
    ) -> None:
        self._redis = redis
        self._ttl = ttl_s
        self._channel = channel

    async def load(self, tenant_id: str) -> tuple[CachedEntry | None, str]:
        try:
            epoch, raw = await self._redis.hmget(cache_key(tenant_id), ["epoch", "entry"])
        except (RedisError, OSError) as exc:
            log.warning("policy cache unavailable", extra={"error": type(exc).__name__})
            return None, "unavailable"  # an epoch that never matches: the result is not cached
        return (None if raw is None else _decode(raw)), _text(epoch)

    async def store(self, tenant_id: str, entry: CachedEntry, epoch: str) -> None:
        try:
            await _STORE_IF_EPOCH(
                self._redis, keys=[cache_key(tenant_id)], args=[epoch, _encode(entry), self._ttl]
            )
        except (RedisError, OSError) as exc:
            log.warning("policy cache unavailable", extra={"error": type(exc).__name__})

    async def drop(self, tenant_id: str) -> None:
        try:
            await self._redis.hdel(cache_key(tenant_id), "entry")
        except (RedisError, OSError) as exc:
            log.warning("policy cache unavailable", extra={"error": type(exc).__name__})

    async def announce(self, tenant_id: str) -> None:
        """After a committed change: invalidate the shared entry and tell every process.

        Raises:
            RedisError: Redis is unreachable; caches may serve the old policy for up to
                :data:`CACHE_TTL_S` seconds.
        """
        key = cache_key(tenant_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hincrby(key, "epoch", 1)
            pipe.hdel(key, "entry")
            pipe.expire(key, self._ttl)
            await pipe.execute()
        await self._redis.publish(self._channel, tenant_id)


async def run_invalidation_listener(
    redis: Redis,
    provider: PolicyProvider,
    stop: asyncio.Event,
    *,
    channel: str = POLICY_UPDATES_CHANNEL,
    subscribed: asyncio.Event | None = None,
    max_backoff_s: float = 5.0,
) -> None:
    """Drop cached policies named on ``policy:updates`` until ``stop`` is set.

    The listener of :mod:`toolfleet.storage.invalidation`: it reconnects with backoff,
    and the whole local layer is dropped when the subscription is lost and again when it
    is back, since updates published meanwhile were missed.

    Args:
        subscribed: set each time the subscription is live (tests wait on it).
    """
    await invalidation.run_invalidation_listener(
        redis, channel, provider, stop, subscribed=subscribed, max_backoff_s=max_backoff_s
    )


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


def _encode(entry: CachedEntry) -> str:
    policy = None if entry.policy is None else entry.policy.model_dump(mode="json")
    return json.dumps({"policy": policy, "version": entry.version}, separators=(",", ":"))


def _decode(raw: bytes | str) -> CachedEntry | None:
    try:
        data = json.loads(raw)
        policy = data["policy"]
        return CachedEntry(
            policy=None if policy is None else TenantPolicy.model_validate(policy),
            version=int(data["version"]),
        )
    except (ValueError, KeyError, TypeError):
        # An entry written by another release of the schema: reload from Postgres.
        return None
