"""A :class:`~toolfleet.analytics.detectors.Anomaly` as the CloudEvent SIEMs read. Pure."""

from __future__ import annotations

from datetime import UTC, datetime

from toolfleet.analytics.detectors import Anomaly, event_id, finding_id
from toolfleet.analytics.ocsf import detection_finding
from toolfleet.analytics.snapshot import AnomalyView
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.models import AnomalyDetected
from toolfleet.events.types import EventType, Source


def anomaly_event(finding: Anomaly, *, now: datetime) -> Envelope:
    """``ai.agent.tool.anomaly``. ``anomaly_id`` is the finding's; the event id is the
    finding's for its first report and one per revision for its updates (a SIEM keys
    the finding by ``anomaly_id``), so a replay re-emits the same events."""
    uid = finding_id(finding)
    data = AnomalyDetected(
        anomaly_id=uid,
        kind=finding.kind.value,
        tenant_id=finding.tenant_id,
        agent_did=finding.agent_did,
        tool_id=finding.tool_id,
        window_start=datetime.fromtimestamp(finding.window[0], UTC),
        window_end=datetime.fromtimestamp(finding.window[1], UTC),
        observed=finding.observed,
        threshold=finding.threshold,
        baseline=finding.baseline,
        summary=finding.summary,
        detected_at=now,
        ocsf=detection_finding(finding, uid=uid, detected_at=now),
    )
    eid = event_id(finding)
    return new_event(
        event_type=EventType.ANOMALY,
        source=Source.ANALYTICS,
        data=data,
        tenant_id=finding.tenant_id,
        invocation_id=None,
        event_id=eid,
    )


def anomaly_view(finding: Anomaly) -> AnomalyView:
    return AnomalyView(
        id=finding_id(finding),
        kind=finding.kind.value,
        summary=finding.summary,
        subject=finding.subject,
        window_start=datetime.fromtimestamp(finding.window[0], UTC),
        observed=finding.observed,
    )
