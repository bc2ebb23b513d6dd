"""Token-bucket arithmetic (the reference model the Lua script mirrors) and its helpers."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet.errors import ErrorCode
from toolfleet.policy.ratelimit import (
    BucketSpec,
    BucketState,
    MemoryRateLimiter,
    RateDecision,
    RateLimits,
    acquire_all,
    rate_limit_error,
    refill,
)

pytestmark = pytest.mark.unit

specs = st.builds(
    BucketSpec.of,
    per_minute=st.integers(min_value=1, max_value=6000),
    burst=st.none() | st.integers(min_value=1, max_value=200),
)
gaps = st.lists(st.floats(min_value=0, max_value=5, allow_nan=False), min_size=1, max_size=80)


def test_bucket_spec_from_limits() -> None:
    spec = BucketSpec.of(120, 10)
    assert spec == BucketSpec(capacity=10.0, rate_per_s=2.0)
    assert BucketSpec.of(30, None) == BucketSpec(capacity=30.0, rate_per_s=0.5)
    assert BucketSpec.of(None, 5) is None
    assert spec is not None
    assert spec.idle_ttl_s == 6
    with pytest.raises(ValueError, match="positive"):
        BucketSpec.of(0, 1)
    with pytest.raises(ValueError, match="at least one"):
        BucketSpec.of(10, 0)


def test_refill_caps_at_capacity_and_ignores_a_clock_going_back() -> None:
    spec = BucketSpec(capacity=5, rate_per_s=1)
    assert refill(spec, None, 100.0) == 5
    assert refill(spec, BucketState(tokens=1, updated_at=100), 102.5) == 3.5
    assert refill(spec, BucketState(tokens=1, updated_at=100), 1000) == 5
    assert refill(spec, BucketState(tokens=1, updated_at=100), 90) == 1


@settings(max_examples=200)
@given(spec=specs, gaps=gaps)
def test_never_grants_more_than_burst_plus_refill(
    spec: BucketSpec | None, gaps: list[float]
) -> None:
    assert spec is not None
    state: BucketState | None = None
    now, granted = 0.0, 0
    for gap in gaps:
        now += gap
        decision, states = acquire_all([(spec, state)], now)
        if decision.allowed:
            assert states is not None
            state = states[0]
            granted += 1
    assert granted <= spec.capacity + spec.rate_per_s * now + 1e-9


@settings(max_examples=200)
@given(spec=specs, calls=st.integers(min_value=0, max_value=300))
def test_burst_at_one_instant_is_exactly_the_capacity(spec: BucketSpec | None, calls: int) -> None:
    assert spec is not None
    state: BucketState | None = None
    granted = 0
    for _ in range(calls):
        _decision, states = acquire_all([(spec, state)], 50.0)
        if states is not None:
            state, granted = states[0], granted + 1
    assert granted == min(calls, int(spec.capacity))


@settings(max_examples=200)
@given(spec=specs, level=st.floats(min_value=0, max_value=0.999), at=st.floats(0, 1e6))
def test_retry_after_is_exactly_when_a_token_is_back(
    spec: BucketSpec | None, level: float, at: float
) -> None:
    assert spec is not None
    state = BucketState(tokens=level, updated_at=at)
    refused, states = acquire_all([(spec, state)], at)
    assert not refused.allowed
    assert states is None
    assert refused.retry_after_s is not None
    assert math.isclose(refused.retry_after_s, (1 - level) / spec.rate_per_s)
    later, _ = acquire_all([(spec, state)], at + refused.retry_after_s * (1 + 1e-9) + 1e-9)
    assert later.allowed
    if refused.retry_after_s > 1e-3:
        sooner, _ = acquire_all([(spec, state)], at + refused.retry_after_s * 0.99)
        assert not sooner.allowed


@settings(max_examples=200)
@given(a=specs, b=specs, a_level=st.floats(0, 300), b_level=st.floats(0, 300))
def test_both_buckets_or_neither(
    a: BucketSpec | None, b: BucketSpec | None, a_level: float, b_level: float
) -> None:
    assert a is not None
    assert b is not None
    sa = BucketState(tokens=min(a_level, a.capacity), updated_at=0)
    sb = BucketState(tokens=min(b_level, b.capacity), updated_at=0)
    decision, states = acquire_all([(a, sa), (b, sb)], 0)
    if sa.tokens >= 1 and sb.tokens >= 1:
        assert decision.allowed
        assert states is not None
        assert [s.tokens for s in states] == [sa.tokens - 1, sb.tokens - 1]
    else:
        assert not decision.allowed
        assert states is None
        waits = [(1 - s.tokens) / spec.rate_per_s for spec, s in ((a, sa), (b, sb)) if s.tokens < 1]
        assert decision.retry_after_s == max(waits)


async def test_in_memory_limiter_tenant_and_tool_buckets() -> None:
    now = [0.0]
    limiter = MemoryRateLimiter(clock=lambda: now[0])
    limits = RateLimits(tenant_per_minute=60, tenant_burst=3, tool_per_minute=60, tool_burst=2)
    results = [await limiter.acquire("t1", "core__echo", limits) for _ in range(3)]
    assert [r.allowed for r in results] == [True, True, False]
    assert results[2].retry_after_s == pytest.approx(1.0)
    # The refusal consumed nothing from the tenant: another tool still gets its last token.
    assert (await limiter.acquire("t1", "core__other", limits)).allowed
    assert not (await limiter.acquire("t1", "core__other", limits)).allowed
    # Another tenant is untouched.
    assert (await limiter.acquire("t2", "core__echo", limits)).allowed
    now[0] = 1.0
    assert (await limiter.acquire("t1", "core__echo", limits)).allowed


async def test_unlimited_always_allows() -> None:
    limiter = MemoryRateLimiter()
    assert RateLimits().unlimited
    for _ in range(1000):
        assert await limiter.acquire("t", "x", RateLimits()) == RateDecision(allowed=True)


def test_rate_limit_error_carries_the_contract_code_and_retry_after() -> None:
    info = rate_limit_error(RateDecision(allowed=False, retry_after_s=1.23456)).to_error_info()
    assert info.code == ErrorCode.RATE_LIMIT_EXCEEDED
    assert info.retryable is True
    assert info.retry_after_s == 1.235
    assert info.details == {"retry_after_s": 1.235}
