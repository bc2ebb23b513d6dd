"""Findings report the real count of their window: announced at the threshold, updated
(same finding, OCSF Update) each time the count doubles, and shown live in between."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.test_analytics import (
    AGENT,
    DENIED,
    T0,
    TENANT,
    _audit,
    denial,
    denial_service,
    outcome,
    request,
)
from toolfleet.analytics.detectors import Anomaly, AnomalyKind, DetectorSettings, finding_id
from toolfleet.analytics.engine import Analyzer, memory_tables
from toolfleet.events.envelope import new_event
from toolfleet.events.models import AnomalyDetected
from toolfleet.events.types import EventType, Source

pytestmark = pytest.mark.unit


def engine(**settings: Any) -> Analyzer:
    return Analyzer(memory_tables(), settings=DetectorSettings(**settings))


def test_forty_denials_end_reported_as_forty_in_three_announcements() -> None:
    analyzer = engine(denial_spike=10)
    found = [f for i in range(40) for f in analyzer.observe(denial(T0 + i))]
    announced = [f for f in found if f.announce]
    assert [(f.observed, f.revision) for f in announced] == [(10, 0), (20, 1), (40, 2)]
    assert announced[-1].summary == f"agent {AGENT} was denied 40 times in one minute"
    assert len({finding_id(f) for f in found}) == 1  # one finding per agent and window
    assert found[-1].observed == 40  # every count from the threshold on is reported
    assert [f.observed for f in found] == list(range(10, 41))


def test_novel_tools_report_how_many_were_called() -> None:
    analyzer = engine(novel_tools=5, novel_warmup_s=600)
    analyzer.observe(request("core__echo", T0 - 3600))
    found = [f for i in range(12) for f in analyzer.observe(request(f"tool{i}", T0 + i))]
    assert [f.kind for f in found] == [AnomalyKind.NOVEL_TOOLS] * 8
    assert [(f.observed, f.revision) for f in found if f.announce] == [(5, 0), (10, 1)]
    assert found[-1].observed == 12
    assert "called 12 tools" in found[-1].summary


def test_the_error_rate_finding_follows_the_minute_s_rate_once_announced() -> None:
    analyzer = engine(error_rate_min_outcomes=10, error_rate=0.5, error_rate_jump=0.3)
    for i in range(20):
        analyzer.observe(outcome("api", "success", T0 - 1800 + i * 60))
    found: list[Anomaly] = []
    for i in range(30):
        status = "error" if i < 20 else "success"
        found += analyzer.observe(outcome("api", status, T0 + i, code="timeout"))
    assert [f.announce for f in found].count(True) == 1
    assert found[0].observed == 1.0
    last = found[-1]
    assert last.observed == round(20 / 30, 4)
    assert "of 30 calls" in last.summary
    assert {finding_id(f) for f in found} == {finding_id(found[0])}


async def test_the_service_shows_one_finding_with_its_live_count_and_emits_updates() -> None:
    service, store = denial_service(10)
    audits = []
    for i in range(37):
        data = _audit(EventType.FAILED, DENIED)
        audits.append(
            new_event(
                event_type=EventType.FAILED,
                source=Source.AUDIT,
                data=data,
                tenant_id=TENANT,
                invocation_id=f"i{i}",
            )
        )
    emitted = [e for audit in audits for e in service.on_audit(audit)]
    assert len(emitted) == 2  # at 10, and the update at 20
    first, update = (AnomalyDetected.model_validate(e.data) for e in emitted)
    assert first.anomaly_id == update.anomaly_id
    assert emitted[0].id != emitted[1].id
    assert (first.observed, update.observed) == (10, 20)
    assert update.ocsf["activity_name"] == "Update"
    assert update.ocsf["finding_info"]["uid"] == first.anomaly_id
    assert first.ocsf["activity_name"] == "Create"
    assert service.found == {"denial_spike": 1}
    # Redelivered (at-least-once): counted once, nothing announced again.
    assert [e for audit in audits for e in service.on_audit(audit)] == []
    await service.publish()
    shown = store.rows[TENANT].anomalies
    assert len(shown) == 1
    assert shown[0].observed == 37
    assert shown[0].summary == f"agent {AGENT} was denied 37 times in one minute"
