"""The snapshots as Prometheus metrics, with bounded labels.

Labels are ``tenant`` (the ``max_tenants`` busiest tenants by name, the rest summed
as ``other``), ``window`` (``1m``, ``1h``), ``status`` and ``code`` (the contract's
closed lists). Tools get no label: a fleet may have thousands. Values are those of
the newest 1 minute window and the snapshot's 1 hour window, so a series never grows
stale labels. Served by the worker's ``TOOLFLEET_METRICS_PORT``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from toolfleet.analytics.snapshot import StatsView, TenantSnapshot

OTHER_TENANTS = "other"
Series = dict[tuple[str, ...], float]


def label_tenants(snapshots: Mapping[str, TenantSnapshot], max_tenants: int) -> dict[str, str]:
    """Tenant → its label: its own name for the ``max_tenants`` busiest, else ``other``."""

    def load(snap: TenantSnapshot) -> int:
        return snap.hour.totals.calls if snap.hour else 0

    busiest = sorted(snapshots.values(), key=lambda s: (-load(s), s.tenant_id))[:max_tenants]
    kept = {s.tenant_id for s in busiest}
    return {t: (t if t in kept else OTHER_TENANTS) for t in snapshots}


class AnalyticsCollector(Collector):
    """Reads the latest snapshots at every scrape."""

    def __init__(
        self,
        snapshots: Callable[[], Mapping[str, TenantSnapshot]],
        anomalies: Callable[[], Mapping[str, int]],
        *,
        max_tenants: int,
    ) -> None:
        self._snapshots = snapshots
        self._anomalies = anomalies
        self._max_tenants = max_tenants

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snapshots = self._snapshots()
        labels = label_tenants(snapshots, self._max_tenants)
        calls: Series = defaultdict(float)
        outcomes: Series = defaultdict(float)
        errors: Series = defaultdict(float)
        cpu: Series = defaultdict(float)
        p95: Series = {}
        memory: Series = {}
        for tenant, snap in snapshots.items():
            label = labels[tenant]
            views: list[tuple[str, StatsView]] = []
            if snap.minutes:
                views.append(("1m", snap.minutes[0].totals))
            if snap.hour:
                views.append(("1h", snap.hour.totals))
            for window, view in views:
                calls[(label, window)] += view.calls
                cpu[(label, window)] += view.cpu_millicore_s
                for status, n in view.by_status.items():
                    outcomes[(label, window, status)] += n
                for code, n in view.by_error_code.items():
                    errors[(label, window, code)] += n
                key: tuple[str, ...] = (label, window)
                if view.p95_ms is not None:
                    p95[key] = max(p95.get(key, 0.0), view.p95_ms)
                memory[key] = max(memory.get(key, 0.0), view.memory_peak_mb)
        yield _gauge("toolfleet_analytics_calls", "Tool calls requested.", calls, ["window"])
        yield _gauge(
            "toolfleet_analytics_outcomes", "Outcomes by status.", outcomes, ["window", "status"]
        )
        yield _gauge(
            "toolfleet_analytics_errors",
            "Failed outcomes by error code.",
            errors,
            ["window", "code"],
        )
        yield _gauge(
            "toolfleet_analytics_duration_p95_ms",
            "p95 call duration (the highest of the tenants a label sums).",
            p95,
            ["window"],
        )
        yield _gauge(
            "toolfleet_analytics_cpu_millicore_seconds", "CPU used by calls.", cpu, ["window"]
        )
        yield _gauge(
            "toolfleet_analytics_memory_peak_mb",
            "Highest memory peak of a call.",
            memory,
            ["window"],
        )
        found = CounterMetricFamily(
            "toolfleet_analytics_anomalies", "Anomalies emitted since start.", labels=["kind"]
        )
        for kind, n in sorted(self._anomalies().items()):
            found.add_metric([kind], n)
        yield found


def _gauge(
    name: str, doc: str, values: Mapping[tuple[str, ...], float], extra: list[str]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["tenant", *extra])
    for labels, value in sorted(values.items()):
        family.add_metric(list(labels), value)
    return family
