"""Semver resolution of a requested version (``1.2.3``, ``^1.2``, ``~1.2``, ``*``).

Pure logic. The newest active version in range wins (one deprecated from a date still
to come is active until then); a deprecated one is used only
when no active one matches, with a warning naming its successor and sunset date; a
sunset one only when the tenant's policy pins that exact version (with a warning); a
removed one never.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import semver

from toolfleet.contract.manifest import LifecycleState, effective_state
from toolfleet.errors import ToolRemoved, ToolVersionNotFound


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionInfo:
    version: str
    state: LifecycleState
    deprecation_message: str | None = None
    deprecation_date: datetime | None = None
    sunset_date: datetime | None = None
    deprecated_in_favor_of: str | None = None

    def state_at(self, now: datetime | None) -> LifecycleState:
        if now is None:
            return self.state
        return effective_state(
            self.state, now, deprecation_date=self.deprecation_date, sunset_date=self.sunset_date
        )


def sunset_follows(deprecation: datetime, sunset: datetime, *, state: LifecycleState) -> bool:
    """Whether ``sunset`` may follow ``deprecation`` for a move to ``state``.

    A deprecation announces a sunset still to come, so it must be strictly later. A
    sunset may fall on the deprecation instant: sunsetting an active version deprecates
    and sunsets it at once (both dates "now").
    """
    if state is LifecycleState.SUNSET:
        return sunset >= deprecation
    return sunset > deprecation


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolution:
    version: str
    warnings: list[str]


def _parse(text: str) -> semver.Version:
    return semver.Version.parse(text)


def _partial(text: str) -> tuple[int, int | None, int | None]:
    parts = text.split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(text)
    nums = [int(p) for p in parts]
    return nums[0], (nums[1] if len(nums) > 1 else None), (nums[2] if len(nums) > 2 else None)


def matches(spec: str, version: str) -> bool:
    """Whether ``version`` satisfies ``spec`` (npm/cargo semantics for ``^`` and ``~``)."""
    spec = spec.strip()
    v = _parse(version)
    if spec in {"", "*", "x", "latest"}:
        return not v.prerelease
    if spec[0] in "^~":
        major, minor, patch = _partial(spec[1:])
        low = semver.Version(major, minor or 0, patch or 0)
        if spec[0] == "~":
            high = (
                semver.Version(major + 1, 0, 0)
                if minor is None
                else semver.Version(major, minor + 1, 0)
            )
        elif major > 0 or minor is None:
            high = semver.Version(major + 1, 0, 0)
        elif minor > 0 or patch is None:
            high = semver.Version(0, minor + 1, 0)
        else:
            high = semver.Version(0, 0, (patch or 0) + 1)
        return low <= v < high and not v.prerelease
    if spec[0] in "<>=!":
        return all(_compare(v, clause.strip()) for clause in spec.split(","))
    try:
        return v == _parse(spec)
    except ValueError:
        major, minor, patch = _partial(spec)  # "1" or "1.2": any patch of it
        return (
            v.major == major
            and (minor is None or v.minor == minor)
            and (patch is None or v.patch == patch)
            and not v.prerelease
        )


def _compare(v: semver.Version, clause: str) -> bool:
    """One ``<op><version>`` clause; a partial version is padded (``>=1.1`` is ``>=1.1.0``)."""
    op = clause[:2] if clause[:2] in {">=", "<=", "==", "!="} else clause[:1]
    if op not in {">", "<", ">=", "<=", "==", "!=", "="}:
        raise ValueError(clause)
    major, minor, patch = _partial(clause[len(op) :].strip())
    bound = semver.Version(major, minor or 0, patch or 0)
    cmp = v.compare(bound)
    return {
        ">": cmp > 0,
        "<": cmp < 0,
        ">=": cmp >= 0,
        "<=": cmp <= 0,
        "==": cmp == 0,
        "=": cmp == 0,
        "!=": cmp != 0,
    }[op] and not v.prerelease


def is_valid_spec(spec: str) -> bool:
    try:
        matches(spec, "0.0.0")
    except ValueError:
        return False
    return True


def exact_version(spec: str) -> str | None:
    """The one version ``spec`` names exactly (``1.2.3``, ``=1.2.3``, ``==1.2.3``), else None."""
    text = spec.strip().lstrip("=").strip()
    try:
        return str(_parse(text))
    except ValueError:
        return None


def resolve(
    tool_id: str,
    spec: str,
    available: Sequence[VersionInfo],
    *,
    now: datetime | None = None,
    pinned: frozenset[str] = frozenset(),
) -> Resolution:
    """Pick the version ``spec`` names among ``available``.

    ``now`` applies sunset dates (``None``: states as stored); ``pinned`` holds the exact
    versions the tenant's policy pins, the only sunset versions that may still run.
    """
    if not is_valid_spec(spec):
        raise ToolVersionNotFound(
            f"{spec!r} is not a version or range", details={"tool_id": tool_id}
        )
    candidates = sorted(
        (info for info in available if matches(spec, info.version)),
        key=lambda info: _parse(info.version),
        reverse=True,
    )
    if not candidates:
        raise ToolVersionNotFound(
            f"no version of {tool_id} matches {spec!r}",
            details={
                "tool_id": tool_id,
                "requested": spec,
                "available": [
                    i.version for i in available if i.state is not LifecycleState.REMOVED
                ],
            },
        )
    for state in (LifecycleState.ACTIVE, LifecycleState.DEPRECATED, LifecycleState.SUNSET):
        for info in candidates:
            if info.state_at(now) is not state:
                continue
            if state is LifecycleState.SUNSET and info.version not in pinned:
                continue
            return Resolution(
                version=info.version, warnings=_warnings(tool_id, info, available, now)
            )
    newest = candidates[0]
    gone = "has been removed"
    if newest.state_at(now) is LifecycleState.SUNSET:
        gone = "is past its sunset date" + _on(newest.sunset_date)
    raise ToolRemoved(
        f"{tool_id}@{newest.version} {gone}{_successor_hint(newest, available, now)}",
        details={"tool_id": tool_id, "requested": spec},
    )


def _on(when: datetime | None) -> str:
    return f" ({when.date().isoformat()})" if when is not None else ""


def _successor(
    chosen: VersionInfo, available: Sequence[VersionInfo], now: datetime | None
) -> str | None:
    if chosen.deprecated_in_favor_of:
        return chosen.deprecated_in_favor_of
    newest = max(
        (i for i in available if i.state_at(now) is LifecycleState.ACTIVE),
        key=lambda i: _parse(i.version),
        default=None,
    )
    return newest.version if newest is not None else None


def _successor_hint(
    chosen: VersionInfo, available: Sequence[VersionInfo], now: datetime | None
) -> str:
    successor = _successor(chosen, available, now)
    return f"; use {successor}" if successor else ""


def _warnings(
    tool_id: str, chosen: VersionInfo, available: Sequence[VersionInfo], now: datetime | None
) -> list[str]:
    state = chosen.state_at(now)
    if state is LifecycleState.DEPRECATED:
        text = f"tool {tool_id}@{chosen.version} is deprecated"
        text += _successor_hint(chosen, available, now)
        if chosen.sunset_date is not None:
            text += f"; sunset on {chosen.sunset_date.date().isoformat()}"
    elif state is LifecycleState.SUNSET:
        text = (
            f"tool {tool_id}@{chosen.version} is past its sunset date{_on(chosen.sunset_date)} "
            "and runs only because this tenant's policy pins it"
        )
        text += _successor_hint(chosen, available, now)
    else:
        return []
    if chosen.deprecation_message:
        text += f" ({chosen.deprecation_message})"
    return [text]
