"""What one window knows about one tenant or tool: :class:`WindowStats`. Pure.

Values are small and mergeable so a windowed table can hold them: counts by status and
error code (both bounded label sets), a log-bucket duration histogram for p50/p95 (a
quantile reads at most 10 % above the truth; about 200 buckets whatever the traffic),
CPU summed and memory peak as a maximum.
"""

from __future__ import annotations

import math
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.analytics.facts import AuditFact

#: Bucket growth factor: a quantile read from a bucket is at most 10 % above the truth.
_GROWTH: Final = 1.1
_LOG_GROWTH: Final = math.log(_GROWTH)


def bucket_of(value_ms: float) -> int:
    """Histogram bucket of a duration: 0 for under 1 ms, else ⌈log₁.₁(ms)⌉ + 1."""
    if value_ms < 1:
        return 0
    return math.ceil(math.log(value_ms) / _LOG_GROWTH) + 1


def bucket_upper(bucket: int) -> float:
    """The largest duration (ms) bucket ``bucket`` holds."""
    return 1.0 if bucket == 0 else _GROWTH ** (bucket - 1)


class DurationHistogram(BaseModel):
    """Sparse log-bucket histogram of durations in milliseconds."""

    model_config = ConfigDict(frozen=True)

    buckets: dict[int, int] = Field(default_factory=dict)
    count: int = 0

    def add(self, value_ms: float) -> DurationHistogram:
        bucket = bucket_of(value_ms)
        buckets = dict(self.buckets)
        buckets[bucket] = buckets.get(bucket, 0) + 1
        return DurationHistogram(buckets=buckets, count=self.count + 1)

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0 < q ≤ 1) in ms, as its bucket's upper bound; None if empty."""
        if self.count == 0:
            return None
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for bucket in sorted(self.buckets):
            seen += self.buckets[bucket]
            if seen >= rank:
                return round(bucket_upper(bucket), 3)
        return round(bucket_upper(max(self.buckets)), 3)  # pragma: no cover - counts agree


class WindowStats(BaseModel):
    """Counts of one window for one tenant (or one tool of a tenant)."""

    model_config = ConfigDict(frozen=True)

    calls: int = 0
    """Tool calls requested (``invoke.requested``)."""
    outcomes: int = 0
    """Terminal outcomes (one per invocation)."""
    by_status: dict[str, int] = Field(default_factory=dict)
    """Outcomes by terminal status."""
    by_error_code: dict[str, int] = Field(default_factory=dict)
    """Failed outcomes by error code."""
    denials: int = 0
    """Outcomes that were ``permission_denied`` or ``approval_denied``."""
    errors: int = 0
    """Outcomes with status ``error`` or ``timeout``: the tool's error rate counts these."""
    durations: DurationHistogram = Field(default_factory=DurationHistogram)
    cpu_millicore_s: float = 0.0
    """CPU used by the window's calls (``cpu_used_millicore_seconds``, summed)."""
    memory_peak_mb: float = 0.0
    """The highest ``memory_peak_mb`` of the window's calls."""

    def add(self, fact: AuditFact) -> WindowStats:
        """These stats with ``fact`` counted (facts that are neither request nor outcome
        change nothing)."""
        if fact.is_request:
            return self.model_copy(update={"calls": self.calls + 1})
        if not fact.is_outcome:
            return self
        assert fact.status is not None
        update: dict[str, object] = {
            "outcomes": self.outcomes + 1,
            "by_status": _bump(self.by_status, fact.status),
            "denials": self.denials + int(fact.is_denial),
            "errors": self.errors + int(fact.is_error),
        }
        if fact.error_code:
            update["by_error_code"] = _bump(self.by_error_code, fact.error_code)
        if fact.duration_ms is not None:
            update["durations"] = self.durations.add(fact.duration_ms)
        if fact.cpu_millicore_s is not None:
            update["cpu_millicore_s"] = self.cpu_millicore_s + fact.cpu_millicore_s
        if fact.memory_peak_mb is not None:
            update["memory_peak_mb"] = max(self.memory_peak_mb, fact.memory_peak_mb)
        return self.model_copy(update=update)

    @property
    def error_rate(self) -> float:
        return self.errors / self.outcomes if self.outcomes else 0.0

    def without(self, other: WindowStats) -> tuple[int, int]:
        """``(outcomes, errors)`` of these stats minus ``other``'s (a baseline that
        leaves out the newest part of a longer window)."""
        return max(0, self.outcomes - other.outcomes), max(0, self.errors - other.errors)


def _bump(counts: dict[str, int], key: str) -> dict[str, int]:
    out = dict(counts)
    out[key] = out.get(key, 0) + 1
    return out
