"""The OCSF 1.8 Detection Finding (class 2004) projection of an anomaly. Pure.

Beside the API Activity projection of every audit record (:mod:`toolfleet.audit.ocsf`):
the finding is created once (``activity_id`` 1 Create, ``type_uid`` 200401, status New)
and updated as its count doubles (``activity_id`` 2 Update, ``type_uid`` 200402, status
In Progress), always under the same ``finding_info.uid``; it names the rule as its
analytic. Severity: 3 Medium for a denial
spike or novel tools (an agent probing what it may do), 2 Low for a tool's error-rate
jump. The agent is the actor, the tool a resource; counts and thresholds go under
``unmapped``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from toolfleet.analytics.detectors import Anomaly, AnomalyKind, event_id
from toolfleet.audit.ocsf import OCSF_VERSION, PRODUCT, epoch_ms

CATEGORY_UID: Final = 2
CLASS_UID: Final = 2004
ACTIVITY_CREATE: Final = 1
ACTIVITY_UPDATE: Final = 2
_SEVERITY: Final = {
    AnomalyKind.DENIAL_SPIKE: (3, "Medium"),
    AnomalyKind.NOVEL_TOOLS: (3, "Medium"),
    AnomalyKind.ERROR_RATE_JUMP: (2, "Low"),
}
_TITLES: Final = {
    AnomalyKind.DENIAL_SPIKE: "Denial spike",
    AnomalyKind.ERROR_RATE_JUMP: "Tool error-rate jump",
    AnomalyKind.NOVEL_TOOLS: "Agent calling never-before-called tools",
}


def detection_finding(finding: Anomaly, *, uid: str, detected_at: datetime) -> dict[str, Any]:
    """The OCSF Detection Finding of ``finding``, whose finding id is ``uid``."""
    severity_id, severity = _SEVERITY[finding.kind]
    update = finding.revision > 0
    activity = ACTIVITY_UPDATE if update else ACTIVITY_CREATE
    start_ms, end_ms = (int(edge * 1000) for edge in finding.window)
    event: dict[str, Any] = {
        "activity_id": activity,
        "activity_name": "Update" if update else "Create",
        "category_uid": CATEGORY_UID,
        "category_name": "Findings",
        "class_uid": CLASS_UID,
        "class_name": "Detection Finding",
        "type_uid": CLASS_UID * 100 + activity,
        "type_name": f"Detection Finding: {'Update' if update else 'Create'}",
        "time": epoch_ms(detected_at),
        "severity_id": severity_id,
        "severity": severity,
        "status_id": 2 if update else 1,
        "status": "In Progress" if update else "New",
        "message": finding.summary,
        "finding_info": {
            "uid": uid,
            "title": _TITLES[finding.kind],
            "desc": finding.summary,
            "types": [finding.kind.value],
            "first_seen_time": start_ms,
            "last_seen_time": end_ms,
            "analytic": {
                "uid": finding.kind.value,
                "name": finding.kind.value,
                "type_id": 1,
                "type": "Rule",
            },
        },
        "metadata": {
            "version": OCSF_VERSION,
            "product": {"name": PRODUCT, "vendor_name": PRODUCT},
            "uid": event_id(finding),
            "event_code": "ai.agent.tool.anomaly",
            "log_name": "audit",
            "tenant_uid": finding.tenant_id,
            "logged_time": epoch_ms(detected_at),
        },
        "cloud": {"provider": PRODUCT},
        "unmapped": {
            "observed": finding.observed,
            "threshold": finding.threshold,
            **({"baseline": finding.baseline} if finding.baseline is not None else {}),
        },
    }
    if finding.agent_did:
        event["actor"] = {"user": {"uid": finding.agent_did, "type": "agent", "type_id": 99}}
    if finding.tool_id:
        event["resources"] = [{"uid": finding.tool_id, "type": "tool"}]
    return event
