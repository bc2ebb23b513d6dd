"""Rate limits as token buckets: per tenant and per tenant + tool, checked together.

A bucket holds at most ``burst`` tokens and refills at ``per_minute / 60`` tokens per
second. A call needs one token from *each* configured bucket; when either is short,
nothing is consumed and the caller learns how long until both have a token again.

This module is the domain side: the limits, the decision, the port and the bucket
arithmetic as a pure reference model. The Redis adapter
(:class:`toolfleet.policy.redis_stores.RedisRateLimiter`) runs the same arithmetic atomically
in one Lua script (``storage/scripts/ratelimit.lua``) on the Redis server's clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from toolfleet.errors import RateLimitExceeded

__all__ = [
    "BucketSpec",
    "BucketState",
    "MemoryRateLimiter",
    "RateDecision",
    "RateLimiter",
    "RateLimits",
    "acquire_all",
    "rate_limit_error",
    "refill",
]


@dataclass(frozen=True, kw_only=True)
class RateLimits:
    """The limits that apply to one call; ``None`` means unlimited."""

    tenant_per_minute: int | None = None
    """Sustained calls per minute for the whole tenant."""
    tenant_burst: int | None = None
    """Calls the tenant may make at once after being idle (default: ``tenant_per_minute``)."""
    tool_per_minute: int | None = None
    """Sustained calls per minute for this tenant and tool."""
    tool_burst: int | None = None
    """Burst for this tenant and tool (default: ``tool_per_minute``)."""

    @property
    def unlimited(self) -> bool:
        """Whether no bucket applies (no Redis call is needed)."""
        return self.tenant_per_minute is None and self.tool_per_minute is None

    def tenant_bucket(self) -> BucketSpec | None:
        """The tenant's bucket, or ``None`` when the tenant is unlimited."""
        return BucketSpec.of(self.tenant_per_minute, self.tenant_burst)

    def tool_bucket(self) -> BucketSpec | None:
        """The tenant + tool bucket, or ``None`` when the tool is unlimited."""
        return BucketSpec.of(self.tool_per_minute, self.tool_burst)


@dataclass(frozen=True, kw_only=True)
class RateDecision:
    """Whether a call may run now; when not, how long until it may."""

    allowed: bool
    """A token was taken from every configured bucket."""
    retry_after_s: float | None = None
    """Seconds until every bucket has a token again (``None`` when allowed)."""


ALLOWED = RateDecision(allowed=True)


class RateLimiter(Protocol):
    """The port policy consumes rate-limit tokens through."""

    async def acquire(self, tenant_id: str, tool_id: str, limits: RateLimits) -> RateDecision:
        """Take one token from the tenant and the tenant + tool bucket, or from neither."""
        ...


def rate_limit_error(decision: RateDecision) -> RateLimitExceeded:
    """The contract error for a refused call (``rate_limit_exceeded``, retryable)."""
    retry = None if decision.retry_after_s is None else round(decision.retry_after_s, 3)
    return RateLimitExceeded(
        "rate limit exceeded; retry later",
        details={"retry_after_s": retry} if retry is not None else {},
        retry_after_s=retry,
    )


# --- the bucket arithmetic (reference model; the Lua script mirrors it) ---------------


@dataclass(frozen=True, kw_only=True)
class BucketSpec:
    """Capacity and refill rate of one bucket."""

    capacity: float
    """Most tokens the bucket holds (the burst)."""
    rate_per_s: float
    """Tokens added per second."""

    @classmethod
    def of(cls, per_minute: int | None, burst: int | None) -> BucketSpec | None:
        """The bucket for ``per_minute`` calls with ``burst`` (``None``: no bucket)."""
        if per_minute is None:
            return None
        if per_minute <= 0:
            raise ValueError("a per-minute rate limit must be positive (use None for unlimited)")
        capacity = per_minute if burst is None else burst
        if capacity < 1:
            raise ValueError("a burst must allow at least one call")
        return cls(capacity=float(capacity), rate_per_s=per_minute / 60.0)

    @property
    def idle_ttl_s(self) -> int:
        """After this long untouched the bucket is full again, so its key may expire."""
        return math.ceil(self.capacity / self.rate_per_s) + 1


@dataclass(frozen=True, kw_only=True)
class BucketState:
    """Tokens in a bucket at a point in time; a missing bucket is a full one."""

    tokens: float
    updated_at: float


def refill(spec: BucketSpec, state: BucketState | None, now: float) -> float:
    """Tokens in the bucket at ``now`` (a clock going backwards adds nothing)."""
    if state is None:
        return spec.capacity
    elapsed = max(0.0, now - state.updated_at)
    return min(spec.capacity, state.tokens + elapsed * spec.rate_per_s)


def acquire_all(
    buckets: Sequence[tuple[BucketSpec, BucketState | None]], now: float
) -> tuple[RateDecision, list[BucketState] | None]:
    """Take one token from every bucket or from none.

    Returns the decision and, when allowed, the buckets' new states (in order); when
    refused nothing changes, and ``retry_after_s`` is the wait of the emptiest bucket.
    """
    levels = [refill(spec, state, now) for spec, state in buckets]
    waits = [
        (1.0 - level) / spec.rate_per_s
        for (spec, _), level in zip(buckets, levels, strict=True)
        if level < 1.0
    ]
    if waits:
        return RateDecision(allowed=False, retry_after_s=max(waits)), None
    return ALLOWED, [BucketState(tokens=level - 1.0, updated_at=now) for level in levels]


@dataclass(kw_only=True)
class MemoryRateLimiter:
    """A single-process :class:`RateLimiter` over the reference model (for tests)."""

    clock: Callable[[], float] = time.monotonic
    _buckets: dict[str, BucketState] = field(default_factory=dict)

    async def acquire(self, tenant_id: str, tool_id: str, limits: RateLimits) -> RateDecision:
        """Take one token from the tenant and tenant + tool buckets, or from neither."""
        named = [
            (name, spec)
            for name, spec in (
                (f"ratelimit:{tenant_id}", limits.tenant_bucket()),
                (f"ratelimit:{tenant_id}:{tool_id}", limits.tool_bucket()),
            )
            if spec is not None
        ]
        if not named:
            return ALLOWED
        decision, states = acquire_all(
            [(spec, self._buckets.get(name)) for name, spec in named], self.clock()
        )
        if states is not None:
            for (name, _), state in zip(named, states, strict=True):
                self._buckets[name] = state
        return decision
