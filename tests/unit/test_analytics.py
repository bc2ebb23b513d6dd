"""Analytics' pure parts: windows, stats, percentiles, detectors, engine, snapshots,
the anomaly event and its OCSF projection, the Prometheus collector. Event time only:
every fact carries its own clock."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolfleet.analytics.detectors import Anomaly, AnomalyKind, DetectorSettings, finding_id
from toolfleet.analytics.engine import Analyzer, memory_tables
from toolfleet.analytics.facts import AuditFact, fact_of
from toolfleet.analytics.findings import anomaly_event
from toolfleet.analytics.metrics import OTHER_TENANTS, AnalyticsCollector, label_tenants
from toolfleet.analytics.service import AnalyticsService
from toolfleet.analytics.snapshot import TenantSnapshot, build_snapshots
from toolfleet.analytics.stats import DurationHistogram, WindowStats
from toolfleet.analytics.windows import HOUR, MINUTE, hopping
from toolfleet.audit.records import audit_event
from toolfleet.events.envelope import new_event
from toolfleet.events.types import EventType, Source

pytestmark = pytest.mark.unit

T0 = 1_800_000_000.0  # a minute boundary, and a quarter hour's
TENANT = "tenant_acme"
AGENT = "did:agent:a"
NOW = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)


def request(tool: str, at: float, agent: str = AGENT) -> AuditFact:
    return AuditFact(
        audit_id=f"r{at}{tool}",
        tenant_id=TENANT,
        at=at,
        event_type=EventType.INVOKE_REQUESTED,
        agent_did=agent,
        tool_id=tool,
    )


def outcome(
    tool: str, status: str, at: float, code: str | None = None, duration_ms: float | None = 10
) -> AuditFact:
    return AuditFact(
        audit_id=f"o{at}{tool}{status}",
        tenant_id=TENANT,
        at=at,
        event_type=EventType.SUCCEEDED if status == "success" else EventType.FAILED,
        agent_did=AGENT,
        tool_id=tool,
        status=status,
        error_code=code,
        duration_ms=duration_ms,
        cpu_millicore_s=1.5,
        memory_peak_mb=32,
    )


def denial(at: float, agent: str = AGENT) -> AuditFact:
    fact = outcome("core__x", "permission_denied", at, code="permission_denied")
    return dataclasses.replace(fact, agent_did=agent, audit_id=f"d{at}{agent}")


# --- windows ------------------------------------------------------------------------


def test_a_tumbling_minute_holds_its_start_but_not_its_end() -> None:
    assert MINUTE.ranges(T0) == [(T0, T0 + 60)]
    assert MINUTE.ranges(T0 + 59.9) == [(T0, T0 + 60)]
    assert MINUTE.ranges(T0 + 60) == [(T0 + 60, T0 + 120)]


def test_an_hour_hops_every_fifteen_minutes() -> None:
    ranges = HOUR.ranges(T0 + 1)
    assert len(ranges) == 4
    assert ranges[-1] == (T0, T0 + 3600) == HOUR.current(T0 + 1)
    assert ranges[0] == (T0 - 2700, T0 + 900) == HOUR.earliest(T0 + 1)


@given(st.floats(min_value=0, max_value=4e9), st.sampled_from([(60, 60), (3600, 300), (10, 3)]))
def test_every_window_of_a_moment_contains_it(at: float, shape: tuple[int, int]) -> None:
    spec = hopping("w", *shape)
    ranges = spec.ranges(at)
    assert len(ranges) == math.ceil(shape[0] / shape[1]) or len(ranges) == shape[0] // shape[1]
    assert all(start <= at < end for start, end in ranges)


def test_window_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="step"):
        hopping("bad", 60, 120)


# --- stats and percentiles -----------------------------------------------------------


@given(st.lists(st.floats(min_value=0, max_value=3_600_000), min_size=1, max_size=200))
def test_percentiles_are_within_ten_percent_above_the_truth(values: list[float]) -> None:
    histogram = DurationHistogram()
    for value in values:
        histogram = histogram.add(value)
    for q in (0.5, 0.95):
        truth = sorted(values)[max(1, math.ceil(q * len(values))) - 1]
        got = histogram.quantile(q)
        assert got is not None
        assert truth <= got * 1.0001
        assert got <= max(1.0, truth * 1.1) * 1.0001


def test_an_empty_histogram_has_no_percentiles() -> None:
    assert DurationHistogram().quantile(0.5) is None


def test_stats_count_calls_outcomes_codes_denials_errors_cpu_and_memory() -> None:
    stats = WindowStats()
    for fact in (
        request("t", T0),
        outcome("t", "success", T0, duration_ms=100),
        outcome("t", "error", T0, code="tool_execution_error"),
        outcome("t", "timeout", T0, code="timeout"),
        denial(T0),
    ):
        stats = stats.add(fact)
    assert stats.calls == 1
    assert stats.outcomes == 4
    assert stats.by_status == {"success": 1, "error": 1, "timeout": 1, "permission_denied": 1}
    assert stats.by_error_code == {
        "tool_execution_error": 1,
        "timeout": 1,
        "permission_denied": 1,
    }
    assert (stats.denials, stats.errors, stats.error_rate) == (1, 2, 0.5)
    assert stats.cpu_millicore_s == 6.0
    assert stats.memory_peak_mb == 32
    assert WindowStats.model_validate(stats.model_dump(mode="json")) == stats


# --- facts ------------------------------------------------------------------------


def _audit(event_type: EventType, data: dict[str, Any]) -> dict[str, Any]:
    parent = new_event(
        event_type=event_type, source=Source.POLICY, data=data, tenant_id=TENANT, invocation_id="i1"
    ).model_copy(update={"time": NOW})
    return audit_event(parent, topic="t", now=NOW).data


def test_a_fact_is_read_from_an_audit_record_with_bounded_labels() -> None:
    data = _audit(
        EventType.FAILED,
        {
            "status": "error",
            "agent_did": AGENT,
            "tenant_id": TENANT,
            "tool_id": "core__x",
            "error": {"code": "made_up_code", "message": "x", "retryable": False},
            "execution_metadata": {
                "duration_ms": 42,
                "cpu_used_millicore_seconds": 7,
                "memory_peak_mb": 12,
            },
        },
    )
    fact = fact_of(data)
    assert fact is not None
    assert fact.at == NOW.timestamp()
    assert (fact.status, fact.error_code) == ("error", "other")
    assert (fact.duration_ms, fact.cpu_millicore_s, fact.memory_peak_mb) == (42, 7, 12)
    assert fact.is_outcome
    assert fact.is_error


def test_a_request_fact_names_the_agent_and_tool() -> None:
    data = _audit(
        EventType.INVOKE_REQUESTED,
        {"tool_id": "core__echo", "agent_context": {"agent_did": AGENT, "tenant_id": TENANT}},
    )
    fact = fact_of(data)
    assert fact is not None
    assert fact.is_request
    assert (fact.agent_did, fact.tool_id, fact.status) == (AGENT, "core__echo", None)


def test_records_without_a_tenant_or_time_are_no_facts() -> None:
    assert fact_of({"audit_id": "a", "event_type": "x", "occurred_at": "nope"}) is None
    assert fact_of({}) is None


# --- engine and detectors ----------------------------------------------------------


def analyzer(**overrides: Any) -> Analyzer:
    settings = DetectorSettings(**{"denial_spike": 3, "novel_tools": 3, **overrides})
    return Analyzer(memory_tables(), settings=settings)


def created(found: list[Anomaly]) -> list[Anomaly]:
    """The first reports among ``found`` (not the updates or count refreshes)."""
    return [f for f in found if f.announce and f.revision == 0]


def test_a_denial_spike_fires_once_per_agent_and_minute() -> None:
    engine = analyzer()
    found = created([f for i in range(10) for f in engine.observe(denial(T0 + i))])
    assert [f.kind for f in found] == [AnomalyKind.DENIAL_SPIKE]
    assert found[0].observed == 3
    assert found[0].window == (T0, T0 + 60)
    assert found[0].agent_did == AGENT
    # another agent, and the next minute, are counted on their own
    other = [f for i in range(3) for f in engine.observe(denial(T0 + i, agent="did:agent:b"))]
    later = [f for i in range(3) for f in engine.observe(denial(T0 + 60 + i))]
    assert len(other) == len(later) == 1
    assert finding_id(later[0]) != finding_id(found[0])


def test_a_redelivered_event_is_counted_once() -> None:
    engine = analyzer()
    fact = denial(T0)
    for _ in range(5):  # at-least-once: the same audit event again after a rebalance
        assert engine.observe(fact) == []
    snap = build_snapshots(
        minute=engine.tables.minute, hour=engine.tables.hour, anomalies={}, now=NOW
    )[TENANT]
    assert snap.minutes[0].totals.denials == 1


def test_a_tool_error_rate_jump_fires_against_the_hour_baseline() -> None:
    engine = analyzer(error_rate_min_outcomes=4, error_rate=0.5, error_rate_jump=0.3)
    # a calm hour: 20 successes, 1 error, spread over earlier minutes
    for i in range(20):
        engine.observe(outcome("api", "success", T0 - 1800 + i * 60))
    engine.observe(outcome("api", "error", T0 - 600, code="tool_execution_error"))
    found: list[Anomaly] = []
    for i in range(8):
        found += engine.observe(outcome("api", "error", T0 + i, code="external_api_error"))
    found = created(found)
    assert [f.kind for f in found] == [AnomalyKind.ERROR_RATE_JUMP]
    jump = found[0]
    assert jump.tool_id == "api"
    assert jump.observed == 1.0
    assert jump.baseline is not None
    assert jump.baseline < 0.1


def test_a_tool_that_always_fails_is_no_jump() -> None:
    engine = analyzer(error_rate_min_outcomes=4)
    for i in range(30):
        engine.observe(outcome("flaky", "error", T0 - 1800 + i * 60, code="timeout"))
    found = [f for i in range(8) for f in engine.observe(outcome("flaky", "error", T0 + i))]
    assert found == []


def test_novel_tools_fire_for_an_established_agent_only() -> None:
    engine = analyzer(novel_warmup_s=600)
    engine.observe(request("core__echo", T0 - 3600))  # the agent's first call
    # a brand-new agent exploring is not an anomaly
    fresh = [f for i in range(6) for f in engine.observe(request(f"x{i}", T0 + i, "did:agent:n"))]
    assert fresh == []
    # the established agent calling six tools it never called before
    found = created([f for i in range(6) for f in engine.observe(request(f"tool{i}", T0 + i))])
    assert [f.kind for f in found] == [AnomalyKind.NOVEL_TOOLS]
    # the same tools again are known now
    again = [f for i in range(6) for f in engine.observe(request(f"tool{i}", T0 + 61 + i))]
    assert again == []


def test_tables_count_per_tenant_and_tool_in_every_window() -> None:
    engine = analyzer()
    engine.observe(request("a", T0 + 1))
    engine.observe(outcome("a", "success", T0 + 2, duration_ms=100))
    engine.observe(outcome("b", "error", T0 + 61))
    snaps = build_snapshots(
        minute=engine.tables.minute, hour=engine.tables.hour, anomalies={}, now=NOW
    )
    snap = snaps[TENANT]
    assert [m.start.timestamp() for m in snap.minutes] == [T0 + 60, T0]
    assert snap.minutes[1].totals.calls == 1
    assert snap.minutes[1].tools["a"].p50_ms is not None
    assert snap.minutes[0].tools["b"].error_rate == 1.0
    assert snap.hour is not None
    assert snap.hour.start.timestamp() == T0 - 2700
    assert (snap.hour.totals.calls, snap.hour.totals.outcomes) == (1, 2)


# --- service, events, OCSF ---------------------------------------------------------


class MemorySnapshots:
    def __init__(self) -> None:
        self.rows: dict[str, TenantSnapshot] = {}
        self.writes = 0

    async def write(self, snapshots: Any) -> None:
        self.writes += 1
        self.rows.update({s.tenant_id: s for s in snapshots})

    async def read(self, tenant_id: str) -> TenantSnapshot | None:
        return self.rows.get(tenant_id)

    async def tenants(self) -> list[str]:
        return sorted(self.rows)


DENIED: dict[str, Any] = {
    "status": "permission_denied",
    "agent_did": AGENT,
    "tenant_id": TENANT,
    "tool_id": "core__x",
    "error": {"code": "permission_denied", "message": "no", "retryable": False},
}
"""A denied call's outcome, as the audit event carries it."""


def denial_service(denial_spike: int) -> tuple[AnalyticsService, MemorySnapshots]:
    """The analytics service on in-memory tables and snapshots, its denial-spike detector
    firing at ``denial_spike`` denials."""
    tables = memory_tables()
    store = MemorySnapshots()
    service = AnalyticsService(
        analyzer=Analyzer(tables, settings=DetectorSettings(denial_spike=denial_spike)),
        tables=tables,
        store=store,
        clock=lambda: NOW,
    )
    return service, store


async def test_the_service_emits_anomaly_events_and_writes_snapshots_only_when_changed() -> None:
    service, store = denial_service(2)
    emitted = []
    for _ in range(3):
        audit = new_event(
            event_type=EventType.FAILED,
            source=Source.AUDIT,
            data=_audit(EventType.FAILED, DENIED),
            tenant_id=TENANT,
            invocation_id="i1",
        )
        emitted += service.on_audit(audit)
    assert [e.type for e in emitted] == [EventType.ANOMALY]
    assert service.on_audit(emitted[0]) == []  # our own findings are no facts
    assert await service.publish() == 1
    assert await service.publish() == 0  # idle: nothing written
    assert store.writes == 1
    snap = store.rows[TENANT]
    assert [a.kind for a in snap.anomalies] == ["denial_spike"]
    assert service.found == {"denial_spike": 1}


def test_an_anomaly_event_carries_an_ocsf_detection_finding() -> None:
    finding = Anomaly(
        kind=AnomalyKind.ERROR_RATE_JUMP,
        tenant_id=TENANT,
        tool_id="api",
        window=(T0, T0 + 60),
        observed=0.9,
        threshold=0.5,
        baseline=0.05,
        summary="tool api failed 90% of calls in one minute",
    )
    event = anomaly_event(finding, now=NOW)
    assert event.type == EventType.ANOMALY
    assert event.source == Source.ANALYTICS
    assert event.id == finding_id(finding) == anomaly_event(finding, now=NOW).id
    assert event.tenantid == event.partitionkey == TENANT
    ocsf = event.data["ocsf"]
    assert (ocsf["class_uid"], ocsf["category_uid"], ocsf["type_uid"]) == (2004, 2, 200401)
    assert ocsf["finding_info"]["uid"] == event.id
    assert ocsf["finding_info"]["analytic"]["name"] == "error_rate_jump"
    assert ocsf["resources"] == [{"uid": "api", "type": "tool"}]
    assert ocsf["unmapped"] == {"observed": 0.9, "threshold": 0.5, "baseline": 0.05}
    assert ocsf["severity_id"] == 2


# --- metrics ------------------------------------------------------------------------


def test_metric_labels_stay_bounded() -> None:
    engine = analyzer()
    for i in range(5):
        fact = request("t", T0)
        engine.observe(dataclasses.replace(fact, tenant_id=f"t{i}", audit_id=f"a{i}"))
    snaps = build_snapshots(
        minute=engine.tables.minute, hour=engine.tables.hour, anomalies={}, now=NOW
    )
    labels = label_tenants(snaps, max_tenants=2)
    assert sorted(set(labels.values())) == sorted({"t0", "t1", OTHER_TENANTS})
    collector = AnalyticsCollector(lambda: snaps, lambda: {"denial_spike": 2}, max_tenants=2)
    families = {f.name: f for f in collector.collect()}
    calls = {
        tuple(s.labels.values()): s.value for s in families["toolfleet_analytics_calls"].samples
    }
    assert calls[(OTHER_TENANTS, "1m")] == 3
    assert calls[("t0", "1h")] == 1
    anomalies = families["toolfleet_analytics_anomalies"].samples
    assert [(s.labels, s.value) for s in anomalies] == [({"kind": "denial_spike"}, 2)]


def test_the_api_reads_snapshots_without_loading_faust() -> None:
    code = "import sys, toolfleet.api.app; sys.exit('faust' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
