"""The anomaly rules, each a pure function of a fact and the counts around it.

There is one finding per rule, subject and window (:func:`finding_id`). A count-based
rule *announces* it when the count crosses its threshold (``before < threshold <=
after``, revision 0) and again, as an update of the same finding, each time the count
doubles (2, 4, 8 ... times the threshold: revision 1, 2, ...), so a SIEM learns how far it
went in a handful of events, never one per fact. In between, every further fact
returns the finding with ``announce=False``: its live count, for the console's view,
not an event. The error-rate rule announces once per window (a marker the engine keeps)
and then refreshes its rate the same way. A replay of the same facts after a crash
reaches the same counts in the same window, so the events it re-emits carry the same
ids (:func:`event_id`) and SIEMs see each once.
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
    revision: int = 0
    """0: the first report of the finding; n: its n-th update (the count doubled n times)."""
    announce: bool = True
    """Whether it becomes an ``ai.agent.tool.anomaly`` event; False: it only refreshes
    the count the console shows."""

    @property
    def subject(self) -> str:
        return self.agent_did or self.tool_id or self.tenant_id


def finding_id(finding: Anomaly) -> str:
    """Deterministic id: one per rule, subject and window."""
    name = "|".join([finding.kind, finding.tenant_id, finding.subject, f"{finding.window[0]:.0f}"])
    return str(uuid.uuid5(_NAMESPACE, name))


def event_id(finding: Anomaly) -> str:
    """The id of the event announcing ``finding``: the finding's own for its first
    report, one per revision for its updates (deterministic, so replays dedupe)."""
    uid = finding_id(finding)
    if finding.revision == 0:
        return uid
    return str(uuid.uuid5(_NAMESPACE, f"{uid}|{finding.revision}"))


def crossed(before: float, after: float, threshold: float) -> bool:
    return before < threshold <= after


def revision(before: int, after: int, threshold: int) -> int | None:
    """Which report ``before`` → ``after`` makes: 0 when it crosses ``threshold``, n when
    it reaches ``threshold * 2**n``; None when it announces nothing."""
    if threshold <= 0 or after < threshold or before >= after:
        return None
    level, bound = 0, threshold
    while bound <= after:
        if before < bound:
            return level
        level, bound = level + 1, bound * 2
    return None


def _counted(
    kind: AnomalyKind,
    fact: AuditFact,
    *,
    before: int,
    after: int,
    threshold: int,
    window: Window,
    summary: str,
) -> Anomaly | None:
    if after < threshold:
        return None
    level = revision(before, after, threshold)
    return Anomaly(
        kind=kind,
        tenant_id=fact.tenant_id,
        agent_did=fact.agent_did,
        window=window,
        observed=after,
        threshold=threshold,
        summary=summary,
        revision=level or 0,
        announce=level is not None,
    )


def denial_spike(
    fact: AuditFact, *, before: int, after: int, window: Window, settings: DetectorSettings
) -> Anomaly | None:
    """``fact`` took the agent's denials this minute from ``before`` to ``after``."""
    if fact.agent_did is None:
        return None
    return _counted(
        AnomalyKind.DENIAL_SPIKE,
        fact,
        before=before,
        after=after,
        threshold=settings.denial_spike,
        window=window,
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
    found = error_rate_now(fact, minute=minute, hour=hour, window=window, settings=settings)
    assert found is not None
    rate, baseline = found.observed, found.baseline or 0.0
    if rate < settings.error_rate or rate - baseline < settings.error_rate_jump:
        return None
    return found


def error_rate_now(
    fact: AuditFact,
    *,
    minute: WindowStats,
    hour: WindowStats,
    window: Window,
    settings: DetectorSettings,
    announce: bool = True,
) -> Anomaly | None:
    """The tool's error rate this ``minute`` as a finding, whatever it is (after
    :func:`error_rate_jump` announced one: its refreshed rate, ``announce=False``)."""
    if fact.tool_id is None or not minute.outcomes:
        return None
    rate = minute.error_rate
    base_outcomes, base_errors = hour.without(minute)
    baseline = base_errors / base_outcomes if base_outcomes else 0.0
    return Anomaly(
        kind=AnomalyKind.ERROR_RATE_JUMP,
        tenant_id=fact.tenant_id,
        tool_id=fact.tool_id,
        window=window,
        observed=round(rate, 4),
        threshold=settings.error_rate,
        baseline=round(baseline, 4),
        summary=f"tool {fact.tool_id} failed {rate:.0%} of {minute.outcomes} calls in one "
        f"minute (hour baseline {baseline:.0%})",
        announce=announce,
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
    return _counted(
        AnomalyKind.NOVEL_TOOLS,
        fact,
        before=before,
        after=after,
        threshold=settings.novel_tools,
        window=window,
        summary=f"agent {fact.agent_did} called {after} tools it never called before in one minute",
    )
