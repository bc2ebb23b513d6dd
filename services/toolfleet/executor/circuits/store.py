"""Redis adapter of the circuit breakers: ``circuit:state:{name}`` holds the JSON state.

Every write is one Lua script: compare the stored state with the one the step was
computed from, write the new one, and publish the transition (if any) on
``circuit:state:changes``, all atomically, so exactly one executor applies a transition.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from toolfleet.coalescing import Coalescer
from toolfleet.storage.lua import LuaScript

CHANGES_CHANNEL = "circuit:state:changes"

_SWAP = LuaScript(
    "circuit_swap",
    source="""
local current = redis.call('GET', KEYS[1]) or ''
if current ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2])
if ARGV[3] ~= '' then
  redis.call('PUBLISH', ARGV[4], ARGV[3])
end
return 1
""",
)


def state_key(name: str) -> str:
    return f"circuit:state:{name}"


class RedisCircuitStore:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        # The calls of one tool read one circuit: the reads made at about the same time
        # go out together, each circuit read once for all of them.
        self._reads: Coalescer[str, str] = Coalescer(self._load_all)

    async def load(self, name: str) -> str:
        return await self._reads.submit(name)

    async def _load_all(self, names: Sequence[str]) -> list[str]:
        unique = list(dict.fromkeys(names))
        pipe = self._redis.pipeline(transaction=False)
        for name in unique:
            pipe.get(state_key(name))
        found = {name: _text(raw) for name, raw in zip(unique, await pipe.execute(), strict=True)}
        return [found[name] for name in names]

    async def swap(self, name: str, expected: str, new: str, transition: str) -> bool:
        done = await _SWAP(
            self._redis, keys=[state_key(name)], args=[expected, new, transition, CHANGES_CHANNEL]
        )
        return bool(done)


def _text(raw: bytes | str | None) -> str:
    if raw is None:
        return ""
    return raw.decode() if isinstance(raw, bytes) else raw


class MemoryCircuitStore:
    """In-process :class:`~toolfleet.executor.circuits.breaker.CircuitStore` for tests."""

    def __init__(self) -> None:
        self.states: dict[str, str] = {}
        self.published: list[str] = []
        """The transitions announced, as on ``circuit:state:changes``."""

    async def load(self, name: str) -> str:
        return self.states.get(name, "")

    async def swap(self, name: str, expected: str, new: str, transition: str) -> bool:
        if self.states.get(name, "") != expected:
            return False
        self.states[name] = new
        if transition:
            self.published.append(transition)
        return True
