"""The analytics engine: facts in, tables updated, findings out. Pure.

Tables are ports (:class:`WindowTable`, :class:`KeyTable`) holding JSON-able dicts, so
the engine runs the same on the faust tables of :mod:`.app` (changelog-backed) and on
the in-memory ones of the tests. Every window a fact belongs to is updated; detectors
read the newest one.

=============  =======================  ==========================================
table          key                      value
=============  =======================  ==========================================
``minute``     tenant, ``tenant|tool``  :class:`WindowStats` per 1 min window
``hour``       tenant, ``tenant|tool``  :class:`WindowStats` per 1 h hopping window
``subjects``   ``agent|tenant|did``,    :class:`SubjectMinute` per 1 min window
               ``tool|tenant|tool``     (detector counts, fired markers)
``known``      ``tenant|did``           :class:`KnownTools` (first seen, tools called)
``seen``       audit id                 marker per 1 min window: a redelivered
                                        event (at-least-once) is counted once
=============  =======================  ==========================================
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.analytics.detectors import (
    Anomaly,
    AnomalyKind,
    DetectorSettings,
    denial_spike,
    error_rate_jump,
    error_rate_now,
    novel_tools,
)
from toolfleet.analytics.facts import AuditFact
from toolfleet.analytics.stats import WindowStats
from toolfleet.analytics.windows import HOUR, MINUTE, Window, WindowSpec

#: Tools remembered per agent; past this an agent's calls no longer count as novel.
MAX_KNOWN_TOOLS: Final = 512
SEP: Final = "|"


class WindowTable(Protocol):
    """A table of one value per key and window."""

    def get(self, key: str, window: Window) -> dict[str, Any] | None: ...

    def set(self, key: str, window: Window, value: dict[str, Any]) -> None: ...

    def entries(self) -> Iterator[tuple[str, Window, dict[str, Any]]]: ...


class KeyTable(Protocol):
    """A table of one value per key."""

    def get(self, key: str) -> dict[str, Any] | None: ...

    def set(self, key: str, value: dict[str, Any]) -> None: ...


class SubjectMinute(BaseModel):
    """Detector counts of one agent or tool in one minute."""

    model_config = ConfigDict(frozen=True)

    denials: int = 0
    novel: int = 0
    fired: list[AnomalyKind] = Field(default_factory=list)


class KnownTools(BaseModel):
    """The tools an agent has called, and when it was first seen."""

    model_config = ConfigDict(frozen=True)

    first_seen: float
    tools: list[str] = Field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class AnalyticsTables:
    """The engine's tables (see the module table)."""

    minute: WindowTable
    hour: WindowTable
    subjects: WindowTable
    known: KeyTable
    seen: WindowTable


def tool_key(tenant_id: str, tool_id: str) -> str:
    return f"{tenant_id}{SEP}{tool_id}"


def split_key(key: str) -> tuple[str, str | None]:
    """``(tenant, tool)`` of a stats key; tool None for a tenant's own row."""
    tenant, _, tool = key.partition(SEP)
    return tenant, tool or None


class Analyzer:
    """Counts facts into the tables and runs the detectors."""

    def __init__(
        self,
        tables: AnalyticsTables,
        *,
        settings: DetectorSettings,
        minute: WindowSpec = MINUTE,
        hour: WindowSpec = HOUR,
    ) -> None:
        self.tables = tables
        self.settings = settings
        self.minute = minute
        self.hour = hour

    def observe(self, fact: AuditFact) -> list[Anomaly]:
        """Count ``fact`` and return the findings it triggers or updates (usually none):
        those with ``announce`` become events, the others only refresh a count."""
        if not (fact.is_request or fact.is_outcome):
            return []
        minute = self.minute.current(fact.at)
        if self.tables.seen.get(fact.audit_id, minute) is not None:
            return []  # redelivered after a rebalance or a crash: counted already
        self.tables.seen.set(fact.audit_id, minute, {})
        keys = [fact.tenant_id]
        if fact.tool_id:
            keys.append(tool_key(fact.tenant_id, fact.tool_id))
        for key in keys:
            _update(self.tables.minute, self.minute, key, fact)
            _update(self.tables.hour, self.hour, key, fact)
        findings: list[Anomaly] = []
        if fact.agent_did is not None:
            findings += self._agent_rules(fact)
        if fact.tool_id is not None and fact.is_outcome:
            findings += self._tool_rules(fact)
        return findings

    def _agent_rules(self, fact: AuditFact) -> list[Anomaly]:
        assert fact.agent_did is not None
        window = self.minute.current(fact.at)
        key = f"agent{SEP}{fact.tenant_id}{SEP}{fact.agent_did}"
        before = _subject(self.tables.subjects.get(key, window))
        after = before
        found: list[Anomaly] = []
        if fact.is_denial:
            after = after.model_copy(update={"denials": after.denials + 1})
            spike = denial_spike(
                fact,
                before=before.denials,
                after=after.denials,
                window=window,
                settings=self.settings,
            )
            found += [spike] if spike else []
        if fact.is_request and fact.tool_id:
            known = self._remember(fact)
            if known is not None:
                after = after.model_copy(update={"novel": after.novel + 1})
                novel = novel_tools(
                    fact,
                    before=before.novel,
                    after=after.novel,
                    first_seen=known.first_seen,
                    window=window,
                    settings=self.settings,
                )
                found += [novel] if novel else []
        if after != before:
            self.tables.subjects.set(key, window, after.model_dump(mode="json"))
        return found

    def _remember(self, fact: AuditFact) -> KnownTools | None:
        """Record the agent's call of ``fact.tool_id``; the agent's record before it if
        the tool is new to the agent, else None."""
        assert fact.agent_did is not None
        assert fact.tool_id is not None
        key = f"{fact.tenant_id}{SEP}{fact.agent_did}"
        raw = self.tables.known.get(key)
        if raw is None:
            known = KnownTools(first_seen=fact.at)
            self.tables.known.set(
                key, KnownTools(first_seen=fact.at, tools=[fact.tool_id]).model_dump(mode="json")
            )
            return known
        known = KnownTools.model_validate(raw)
        if fact.tool_id in known.tools or len(known.tools) >= MAX_KNOWN_TOOLS:
            return None
        tools = sorted([*known.tools, fact.tool_id])
        first = min(known.first_seen, fact.at)
        self.tables.known.set(key, {"first_seen": first, "tools": tools})
        return known

    def _tool_rules(self, fact: AuditFact) -> list[Anomaly]:
        assert fact.tool_id is not None
        window = self.minute.current(fact.at)
        key = f"tool{SEP}{tool_key(fact.tenant_id, fact.tool_id)}"
        subject = _subject(self.tables.subjects.get(key, window))
        stats_key = tool_key(fact.tenant_id, fact.tool_id)
        minute = _stats(self.tables.minute.get(stats_key, window))
        hour = _stats(self.tables.hour.get(stats_key, self.hour.earliest(fact.at)))
        if AnomalyKind.ERROR_RATE_JUMP in subject.fired:
            # Announced already this minute: only its rate now, for the console.
            now = error_rate_now(
                fact,
                minute=minute,
                hour=hour,
                window=window,
                settings=self.settings,
                announce=False,
            )
            return [now] if now else []
        jump = error_rate_jump(
            fact, minute=minute, hour=hour, window=window, settings=self.settings
        )
        if jump is None:
            return []
        fired = subject.model_copy(update={"fired": [*subject.fired, jump.kind]})
        self.tables.subjects.set(key, window, fired.model_dump(mode="json"))
        return [jump]


def _update(table: WindowTable, spec: WindowSpec, key: str, fact: AuditFact) -> None:
    for window in spec.ranges(fact.at):
        stats = _stats(table.get(key, window)).add(fact)
        table.set(key, window, stats.model_dump(mode="json"))


def _stats(raw: dict[str, Any] | None) -> WindowStats:
    return WindowStats.model_validate(raw) if raw else WindowStats()


def _subject(raw: dict[str, Any] | None) -> SubjectMinute:
    return SubjectMinute.model_validate(raw) if raw else SubjectMinute()


@dataclass
class MemoryWindowTable:
    """:class:`WindowTable` in a dict (tests, and a fleet without faust)."""

    rows: dict[tuple[str, Window], dict[str, Any]] = field(default_factory=dict)

    def get(self, key: str, window: Window) -> dict[str, Any] | None:
        return self.rows.get((key, window))

    def set(self, key: str, window: Window, value: dict[str, Any]) -> None:
        self.rows[(key, window)] = value

    def entries(self) -> Iterator[tuple[str, Window, dict[str, Any]]]:
        for (key, window), value in list(self.rows.items()):
            yield key, window, value


@dataclass
class MemoryKeyTable:
    """:class:`KeyTable` in a dict."""

    rows: dict[str, dict[str, Any]] = field(default_factory=dict)

    def get(self, key: str) -> dict[str, Any] | None:
        return self.rows.get(key)

    def set(self, key: str, value: dict[str, Any]) -> None:
        self.rows[key] = value


def memory_tables() -> AnalyticsTables:
    return AnalyticsTables(
        minute=MemoryWindowTable(),
        hour=MemoryWindowTable(),
        subjects=MemoryWindowTable(),
        known=MemoryKeyTable(),
        seen=MemoryWindowTable(),
    )
