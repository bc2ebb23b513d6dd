"""The analytics service: audit events in, anomaly events out, snapshots on a timer.

No faust here: :mod:`.app` hands it each decoded audit event from inside the stream
(so the tables it writes are faust's) and calls :meth:`AnalyticsService.publish`
from a timer. The clock is injected.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from datetime import datetime

from toolfleet.analytics.detectors import Anomaly
from toolfleet.analytics.engine import AnalyticsTables, Analyzer, split_key
from toolfleet.analytics.facts import fact_of
from toolfleet.analytics.findings import anomaly_event, anomaly_view
from toolfleet.analytics.snapshot import (
    RECENT_ANOMALIES,
    AnomalyView,
    SnapshotStore,
    TenantSnapshot,
    build_snapshots,
)
from toolfleet.events.envelope import Envelope
from toolfleet.events.types import EventType

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]


class AnalyticsService:
    """Counts audit events into the tables; emits findings; writes snapshots."""

    def __init__(
        self, *, analyzer: Analyzer, tables: AnalyticsTables, store: SnapshotStore, clock: Clock
    ) -> None:
        self._analyzer = analyzer
        self._tables = tables
        self._store = store
        self._clock = clock
        self._dirty = True  # the first timer tick publishes what the changelogs restored
        self._anomalies: dict[str, list[AnomalyView]] = defaultdict(list)
        self._loaded: set[str] = set()
        self.latest: dict[str, TenantSnapshot] = {}
        """The snapshots last written (for the Prometheus collector)."""
        self.found: Counter[str] = Counter()
        """Anomalies emitted since start, by kind."""

    def on_audit(self, event: Envelope) -> list[Envelope]:
        """Count one audit event; the anomaly events it triggers (to publish first)."""
        if event.type == EventType.ANOMALY:
            return []  # our own findings travel on the same topic
        fact = fact_of(event.data)
        if fact is None:
            return []
        findings = self._analyzer.observe(fact)
        self._dirty = True
        now = self._clock()
        for finding in findings:
            self._show(finding)
            if finding.announce and finding.revision == 0:
                self.found[finding.kind.value] += 1
                log.warning(
                    "anomaly found",
                    extra={"kind": finding.kind.value, "tenant_id": finding.tenant_id},
                )
        return [anomaly_event(f, now=now) for f in findings if f.announce]

    def _show(self, finding: Anomaly) -> None:
        """Put ``finding`` in its tenant's recent findings: in place, with its new count,
        if it is there already (one row per finding), else first."""
        view = anomaly_view(finding)
        recent = self._anomalies[finding.tenant_id]
        for i, shown in enumerate(recent):
            if shown.id == view.id:
                recent[i] = view
                return
        recent.insert(0, view)
        del recent[RECENT_ANOMALIES:]

    async def publish(self) -> int:
        """Write every tenant's snapshot if anything changed; how many were written."""
        if not self._dirty:
            return 0
        self._dirty = False
        snapshots = build_snapshots(
            minute=self._tables.minute,
            hour=self._tables.hour,
            anomalies=await self._anomaly_history(),
            now=self._clock(),
        )
        await self._store.write(snapshots.values())
        self.latest = snapshots
        log.debug("snapshots written", extra={"tenants": len(snapshots)})
        return len(snapshots)

    async def _anomaly_history(self) -> Mapping[str, list[AnomalyView]]:
        """Recent findings per tenant: this run's, after those an earlier run wrote."""
        tenants = {split_key(key)[0] for key, _, _ in self._tables.minute.entries()}
        for tenant in tenants - self._loaded:
            self._loaded.add(tenant)
            previous = await self._store.read(tenant)
            if previous is not None:
                seen = {a.id for a in self._anomalies[tenant]}
                kept = [a for a in previous.anomalies if a.id not in seen]
                self._anomalies[tenant] = (self._anomalies[tenant] + kept)[:RECENT_ANOMALIES]
        return self._anomalies
