"""Calls one agent may have running at once, across every executor (policy's
``max_concurrent_per_agent``, default 4). Calls past the limit wait; they are not failed.

A slot is a member of a Redis sorted set scored by its lease expiry, so a slot held by
an executor that died frees itself when the call's timeout has passed. The check-and-take
is one Lua script on Redis' clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from redis.asyncio import Redis

from toolfleet.storage.lua import LuaScript
from toolfleet.storage.redis import CoalescedCommands
from toolfleet.storage.retrying import Backoff, retry_until_stopped

_ACQUIRE = LuaScript(
    "slots_acquire",
    source="""
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local lease_ms = tonumber(ARGV[3])
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now_ms + lease_ms, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease_ms)
  return 1
end
return 0
""",
)


class AgentSlots(Protocol):
    async def try_acquire(
        self, agent_key: str, holder: str, limit: int, lease_s: float
    ) -> bool: ...
    def release(self, agent_key: str, holder: str) -> Awaitable[object]:
        """Give the slot back: under way once this returns (the run's stack awaits it
        while the lease finishes: :class:`~toolfleet.executor.admission.Releases`)."""
        ...


def agent_key(tenant_id: str, agent_did: str) -> str:
    return f"agent:running:{{{tenant_id}}}:{agent_did}"


class RedisAgentSlots:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        # The slots of the calls that end together are given back in one round trip.
        self._releases = CoalescedCommands(redis)

    async def try_acquire(self, agent_key: str, holder: str, limit: int, lease_s: float) -> bool:
        taken = await _ACQUIRE(
            self._redis, keys=[agent_key], args=[holder, limit, int(lease_s * 1000)]
        )
        return bool(taken)

    def release(self, agent_key: str, holder: str) -> Awaitable[object]:
        return self._releases.send(lambda pipe: pipe.zrem(agent_key, holder))


async def wait_for_slot(
    slots: AgentSlots,
    agent_key: str,
    holder: str,
    *,
    limit: int,
    lease_s: float,
    give_up: Callable[[], Awaitable[bool]],
    max_backoff_s: float = 1.0,
) -> bool:
    """Take a slot, waiting with jittered backoff; False if ``give_up`` says so first.

    The holder is the invocation id, so a redelivered call takes its own slot back.
    """
    taken = await retry_until_stopped(
        lambda: slots.try_acquire(agent_key, holder, limit, lease_s),
        what="waiting for an agent slot",
        backoff=Backoff(first_s=0.02, max_s=max_backoff_s),
        again=lambda took: not took,  # a taken slot is no failure: nothing is logged
        give_up=give_up,
    )
    return taken is True


class MemoryAgentSlots:
    """In-process :class:`AgentSlots` for tests and single-process tools.

    Leases expire on ``clock`` (seconds), like the Redis slots on Redis' clock.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.held: dict[str, dict[str, float]] = {}
        """Per agent key: holder -> lease expiry."""
        self._clock = clock

    async def try_acquire(self, agent_key: str, holder: str, limit: int, lease_s: float) -> bool:
        now = self._clock()
        slots = self.held.setdefault(agent_key, {})
        for expired in [h for h, until in slots.items() if until <= now]:
            del slots[expired]
        if holder not in slots and len(slots) >= limit:
            return False
        slots[holder] = now + lease_s
        return True

    def release(self, agent_key: str, holder: str) -> Awaitable[object]:
        self.held.get(agent_key, {}).pop(holder, None)
        released: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        released.set_result(None)
        return released
