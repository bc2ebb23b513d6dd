"""The tables as the API and Prometheus see them: one :class:`TenantSnapshot` per
tenant, written by the analytics app and read by the API (which never runs faust).

A snapshot is built from event time, not the wall clock: it shows the tenant's newest
1 minute windows and the fullest 1 hour window around its newest fact, so replaying a
stream gives the same snapshot whenever it runs. Pure, except :class:`RedisSnapshots`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from pydantic import BaseModel, Field
from redis.asyncio import Redis

from toolfleet.analytics.engine import WindowTable, split_key
from toolfleet.analytics.stats import WindowStats
from toolfleet.analytics.windows import HOUR, MINUTE, Window, WindowSpec

#: Newest 1 minute windows a snapshot shows.
RECENT_MINUTES: Final = 5
#: Newest anomalies a snapshot keeps.
RECENT_ANOMALIES: Final = 20
_KEY: Final = "analytics:tenant:{tenant}"
_TENANTS: Final = "analytics:tenants"
CHANGES: Final = "analytics:changed"
"""Redis channel: each payload is the tenant whose snapshot was just written (the API's
``/v1/analytics/tenants/{tenant}/events`` pushes it to the console from there)."""


class StatsView(BaseModel):
    """One window's counts for a tenant or one of its tools."""

    calls: int
    outcomes: int
    by_status: dict[str, int]
    by_error_code: dict[str, int]
    denials: int
    errors: int
    error_rate: float
    p50_ms: float | None
    p95_ms: float | None
    cpu_millicore_s: float
    memory_peak_mb: float

    @classmethod
    def of(cls, stats: WindowStats) -> StatsView:
        return cls(
            calls=stats.calls,
            outcomes=stats.outcomes,
            by_status=stats.by_status,
            by_error_code=stats.by_error_code,
            denials=stats.denials,
            errors=stats.errors,
            error_rate=round(stats.error_rate, 4),
            p50_ms=stats.durations.quantile(0.5),
            p95_ms=stats.durations.quantile(0.95),
            cpu_millicore_s=round(stats.cpu_millicore_s, 3),
            memory_peak_mb=stats.memory_peak_mb,
        )


class WindowView(BaseModel):
    """One window of a tenant: its totals and each tool's."""

    window: str
    """``1m`` (tumbling) or ``1h`` (hopping)."""
    start: datetime
    end: datetime
    totals: StatsView
    tools: dict[str, StatsView] = Field(default_factory=dict)


class AnomalyView(BaseModel):
    """A finding the detectors emitted (``ai.agent.tool.anomaly``)."""

    id: str
    kind: str
    summary: str
    subject: str
    window_start: datetime
    observed: float


class TenantSnapshot(BaseModel):
    """What ``GET /v1/analytics/tenants/{tenant}`` answers."""

    tenant_id: str
    generated_at: datetime | None = None
    """When the analytics app wrote it; None if it never saw the tenant."""
    minutes: list[WindowView] = Field(default_factory=list)
    """Newest 1 minute windows, newest first."""
    hour: WindowView | None = None
    """The 1 hour window that holds the newest fact and the most of the hour before it."""
    anomalies: list[AnomalyView] = Field(default_factory=list)
    """Newest findings first."""


def build_snapshots(
    *,
    minute: WindowTable,
    hour: WindowTable,
    anomalies: Mapping[str, list[AnomalyView]],
    now: datetime,
    minute_spec: WindowSpec = MINUTE,
    hour_spec: WindowSpec = HOUR,
) -> dict[str, TenantSnapshot]:
    """Every tenant's snapshot from the tables."""
    minutes = _by_tenant(minute.entries())
    hours = _by_tenant(hour.entries())
    snapshots: dict[str, TenantSnapshot] = {}
    for tenant, windows in minutes.items():
        newest = sorted(windows, reverse=True)[:RECENT_MINUTES]
        full_hour = hour_spec.earliest(newest[0][0])
        hour_rows = hours.get(tenant, {}).get(full_hour)
        snapshots[tenant] = TenantSnapshot(
            tenant_id=tenant,
            generated_at=now,
            minutes=[_view(minute_spec, w, windows[w]) for w in newest],
            hour=_view(hour_spec, full_hour, hour_rows) if hour_rows else None,
            anomalies=anomalies.get(tenant, [])[:RECENT_ANOMALIES],
        )
    return snapshots


Rows = dict[str | None, dict[str, Any]]


def _by_tenant(
    entries: Iterable[tuple[str, Window, dict[str, Any]]],
) -> dict[str, dict[Window, Rows]]:
    out: dict[str, dict[Window, Rows]] = defaultdict(lambda: defaultdict(dict))
    for key, window, value in entries:
        tenant, tool = split_key(key)
        out[tenant][tuple(window)][tool] = value  # type: ignore[index]
    return out


def _view(spec: WindowSpec, window: Window, rows: Rows) -> WindowView:
    totals = WindowStats.model_validate(rows.get(None) or {})
    return WindowView(
        window=spec.name,
        start=_time(window[0]),
        end=_time(window[1]),
        totals=StatsView.of(totals),
        tools={
            tool: StatsView.of(WindowStats.model_validate(value))
            for tool, value in sorted(rows.items(), key=lambda kv: kv[0] or "")
            if tool is not None
        },
    )


def _time(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


class SnapshotStore(Protocol):
    """Where snapshots live between the app and the API."""

    async def write(self, snapshots: Iterable[TenantSnapshot]) -> None: ...

    async def read(self, tenant_id: str) -> TenantSnapshot | None: ...

    async def tenants(self) -> list[str]: ...


class RedisSnapshots:
    """Snapshots as JSON strings under ``analytics:tenant:{tenant}``, tenants in a set;
    each write names its tenants on :data:`CHANGES`."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def write(self, snapshots: Iterable[TenantSnapshot]) -> None:
        batch = list(snapshots)
        if not batch:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for snap in batch:
                pipe.set(_KEY.format(tenant=snap.tenant_id), snap.model_dump_json())
            pipe.sadd(_TENANTS, *(snap.tenant_id for snap in batch))
            for snap in batch:
                pipe.publish(CHANGES, snap.tenant_id)
            await pipe.execute()

    async def read(self, tenant_id: str) -> TenantSnapshot | None:
        raw = await self._redis.get(_KEY.format(tenant=tenant_id))
        return TenantSnapshot.model_validate_json(raw) if raw else None

    async def tenants(self) -> list[str]:
        members = await self._redis.smembers(_TENANTS)
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)
