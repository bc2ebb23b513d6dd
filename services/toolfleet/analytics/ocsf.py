"""The OCSF 1.8 Detection Finding (class 2004) projection of an anomaly. Pure.

Beside the API Activity projection of every audit record (:mod:`toolfleet.audit.ocsf`):
the finding is created once (``activity_id`` 1 Create, ``type_uid`` 200401), is New
(``status_id`` 1), and names the rule as its analytic. Severity: 3 Medium for a denial
spike or novel tools (an agent probing what it may do), 2 Low for a tool's error-rate
jump. The agent is the actor, the tool a resource; counts and thresholds go under
``unmapped``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from toolfleet.analytics.detectors import Anomaly, AnomalyKind
from toolfleet.audit.ocsf import OCSF_VERSION, PRODUCT, epoch_ms

CATEGORY_UID: Final = 2
CLASS_UID: Final = 2004
ACTIVITY_CREATE: Final = 1
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
    """The OCSF Detection Finding of ``finding``, whose event id is ``uid``."""
    severity_id, severity = _SEVERITY[finding.kind]
    start_ms, end_ms = (int(edge * 1000) for edge in finding.window)
    event: dict[str, Any] = {
        "activity_id": ACTIVITY_CREATE,
        "activity_name": "Create",
        "category_uid": CATEGORY_UID,
        "category_name": "Findings",
        "class_uid": CLASS_UID,
        "class_name": "Detection Finding",
        "type_uid": CLASS_UID * 100 + ACTIVITY_CREATE,
        "type_name": "Detection Finding: Create",
        "time": epoch_ms(detected_at),
        "severity_id": severity_id,
        "severity": severity,
        "status_id": 1,
        "status": "New",
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
            "uid": uid,
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
