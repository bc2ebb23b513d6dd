"""The anomaly rules, each a pure function of a fact and the counts around it.

Every rule fires at most once per subject and window: a count-based rule when the
count *crosses* its threshold (``before < threshold <= after``), the error-rate rule
through a marker the engine keeps in the window. A replay of the same facts after a
crash crosses the same threshold in the same window, so the finding it re-emits has
the same id and SIEMs see it once (:func:`finding_id`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum

from toolfleet.analytics.facts import AuditFact
from toolfleet.analytics.stats import WindowStats
from toolfleet.analytics.windows import Window

_NAMESPACE = uuid.UUID("0f6c1c1e-8c0d-4a53-9d1b-6a1c4f1d2e77")


class AnomalyKind(StrEnum):
    """What a detector saw."""

    DENIAL_SPIKE = "denial_spike"
    """One agent was denied many times in one minute."""
    ERROR_RATE_JUMP = "error_rate_jump"
    """A tool's error rate this minute is far above its rate over the last hour."""
    NOVEL_TOOLS = "novel_tools"
    """An established agent called many tools it never called before, in one minute."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DetectorSettings:
    """Thresholds of the rules (from ``TOOLFLEET_ANALYTICS_*``)."""

    denial_spike: int = 10
    """Denials of one agent in one minute that make a spike."""
    error_rate_min_outcomes: int = 10
    """Outcomes of a tool in one minute before its error rate is judged."""
    error_rate: float = 0.5
    """Error rate of a minute that counts as high ..."""
    error_rate_jump: float = 0.3
    """... when it is also this much above the tool's rate over the rest of the hour."""
    novel_tools: int = 5
    """Never-before-called tools one agent calls in one minute that make a finding."""
    novel_warmup_s: float = 600.0
    """An agent first seen less than this long ago is still exploring: no novelty
    findings for it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Anomaly:
    """One anomaly, before it becomes an event."""

    kind: AnomalyKind
    tenant_id: str
    window: Window
    observed: float
    threshold: float
    summary: str
    agent_did: str | None = None
    tool_id: str | None = None
    baseline: float | None = None

    @property
    def subject(self) -> str:
        return self.agent_did or self.tool_id or self.tenant_id


def finding_id(finding: Anomaly) -> str:
    """Deterministic id: one per rule, subject and window."""
    name = "|".join([finding.kind, finding.tenant_id, finding.subject, f"{finding.window[0]:.0f}"])
    return str(uuid.uuid5(_NAMESPACE, name))


def crossed(before: float, after: float, threshold: float) -> bool:
    return before < threshold <= after


def denial_spike(
    fact: AuditFact, *, before: int, after: int, window: Window, settings: DetectorSettings
) -> Anomaly | None:
    """``fact`` took the agent's denials this minute from ``before`` to ``after``."""
    if fact.agent_did is None or not crossed(before, after, settings.denial_spike):
        return None
    return Anomaly(
        kind=AnomalyKind.DENIAL_SPIKE,
        tenant_id=fact.tenant_id,
        agent_did=fact.agent_did,
        window=window,
        observed=after,
        threshold=settings.denial_spike,
        summary=f"agent {fact.agent_did} was denied {after} times in one minute",
    )


def error_rate_jump(
    fact: AuditFact,
    *,
    minute: WindowStats,
    hour: WindowStats,
    window: Window,
    settings: DetectorSettings,
) -> Anomaly | None:
    """The tool's error rate this ``minute`` (``fact`` counted) against the rest of the
    ``hour`` window that contains it. The caller fires it once per window."""
    if fact.tool_id is None or not fact.is_outcome:
        return None
    if minute.outcomes < settings.error_rate_min_outcomes:
        return None
    rate = minute.error_rate
    base_outcomes, base_errors = hour.without(minute)
    baseline = base_errors / base_outcomes if base_outcomes else 0.0
    if rate < settings.error_rate or rate - baseline < settings.error_rate_jump:
        return None
    return Anomaly(
        kind=AnomalyKind.ERROR_RATE_JUMP,
        tenant_id=fact.tenant_id,
        tool_id=fact.tool_id,
        window=window,
        observed=round(rate, 4),
        threshold=settings.error_rate,
        baseline=round(baseline, 4),
        summary=f"tool {fact.tool_id} failed {rate:.0%} of calls in one minute "
        f"(hour baseline {baseline:.0%})",
    )


def novel_tools(
    fact: AuditFact,
    *,
    before: int,
    after: int,
    first_seen: float,
    window: Window,
    settings: DetectorSettings,
) -> Anomaly | None:
    """``fact`` took the agent's never-before-called tools this minute from ``before``
    to ``after``; the agent was first seen at ``first_seen``."""
    if fact.agent_did is None or fact.at - first_seen < settings.novel_warmup_s:
        return None
    if not crossed(before, after, settings.novel_tools):
        return None
    return Anomaly(
        kind=AnomalyKind.NOVEL_TOOLS,
        tenant_id=fact.tenant_id,
        agent_did=fact.agent_did,
        window=window,
        observed=after,
        threshold=settings.novel_tools,
        summary=f"agent {fact.agent_did} called {after} tools it never called before in one minute",
    )
