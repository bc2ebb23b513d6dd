"""Semver resolution: exact, ^, ~, *, comparisons; lifecycle states; bad specs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet.contract.manifest import LifecycleState, effective_state
from toolfleet.errors import ToolRemoved, ToolVersionNotFound
from toolfleet.registry.versions import (
    VersionInfo,
    exact_version,
    is_valid_spec,
    matches,
    resolve,
)

pytestmark = pytest.mark.unit

ACTIVE, DEPRECATED, REMOVED = (
    LifecycleState.ACTIVE,
    LifecycleState.DEPRECATED,
    LifecycleState.REMOVED,
)
VERSIONS = ["0.0.3", "0.2.1", "0.2.9", "1.0.0", "1.2.0", "1.2.7", "1.3.0", "2.0.0", "2.1.0-rc.1"]


def infos(*pairs: tuple[str, LifecycleState]) -> list[VersionInfo]:
    return [VersionInfo(version=v, state=s) for v, s in pairs]


ALL_ACTIVE = infos(*((v, ACTIVE) for v in VERSIONS))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("1.2.0", "1.2.0"),
        ("=1.2.0", "1.2.0"),
        ("==1.2.0", "1.2.0"),
        ("2.1.0-rc.1", "2.1.0-rc.1"),
        ("1", "1.3.0"),
        ("1.2", "1.2.7"),
        ("^1.2.0", "1.3.0"),
        ("^1", "1.3.0"),
        ("^0.2.1", "0.2.9"),
        ("^0.0.3", "0.0.3"),
        ("~1.2.0", "1.2.7"),
        ("~1.2", "1.2.7"),
        ("~1", "1.3.0"),
        ("*", "2.0.0"),
        ("", "2.0.0"),
        ("latest", "2.0.0"),
        (" ^1.2.0 ", "1.3.0"),
        (">=1.0.0,<1.3.0", "1.2.7"),
        ("<1.0.0", "0.2.9"),
        (">1.2.0, <=2.0.0", "2.0.0"),
        ("!=2.0.0", "1.3.0"),
    ],
)
def test_resolves_the_newest_match(spec: str, expected: str) -> None:
    resolution = resolve("core__x", spec, ALL_ACTIVE)
    assert resolution.version == expected
    assert resolution.warnings == []


@pytest.mark.parametrize("spec", ["*", "^2", "~2.1", "2"])
def test_prereleases_only_when_named(spec: str) -> None:
    assert not matches(spec, "2.1.0-rc.1")


def test_active_beats_newer_deprecated() -> None:
    available = infos(("1.0.0", ACTIVE), ("1.5.0", DEPRECATED))
    assert resolve("core__x", "^1", available).version == "1.0.0"


def test_deprecated_only_is_used_with_a_warning() -> None:
    available = infos(("1.0.0", DEPRECATED), ("2.0.0", ACTIVE))
    resolution = resolve("core__x", "^1.0.0", available)
    assert resolution.version == "1.0.0"
    assert resolution.warnings == ["tool core__x@1.0.0 is deprecated; use 2.0.0"]


def test_deprecation_message_is_appended_and_no_hint_without_an_active_version() -> None:
    available = [VersionInfo(version="1.0.0", state=DEPRECATED, deprecation_message="sunset")]
    resolution = resolve("core__x", "1.0.0", available)
    assert resolution.warnings == ["tool core__x@1.0.0 is deprecated (sunset)"]


def test_removed_is_never_used() -> None:
    available = infos(("1.0.0", REMOVED), ("2.0.0", ACTIVE))
    with pytest.raises(ToolRemoved, match=r"core__x@1\.0\.0 has been removed"):
        resolve("core__x", "1.0.0", available)


def test_removed_is_skipped_for_an_older_active_match() -> None:
    available = infos(("1.0.0", ACTIVE), ("1.1.0", REMOVED))
    assert resolve("core__x", "^1", available).version == "1.0.0"


def test_no_match_lists_only_usable_versions() -> None:
    available = infos(("1.0.0", ACTIVE), ("1.1.0", REMOVED))
    with pytest.raises(ToolVersionNotFound) as caught:
        resolve("core__x", "^3", available)
    assert caught.value.details["available"] == ["1.0.0"]


def test_nothing_registered_is_not_found() -> None:
    with pytest.raises(ToolVersionNotFound):
        resolve("core__x", "*", [])


@pytest.mark.parametrize(
    "spec",
    ["garbage", "^x", "~", "^", "1.2.3.4", ">=abc", "1.x.y", "v1", "^1.2.3-beta", ">=1.0.0 <2"],
)
def test_garbage_spec(spec: str) -> None:
    assert not is_valid_spec(spec)
    with pytest.raises(ToolVersionNotFound, match="is not a version or range"):
        resolve("core__x", spec, ALL_ACTIVE)


# --- property ---------------------------------------------------------------------------

Triple = tuple[int, int, int]
triples = st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3))


def _text(t: Triple) -> str:
    return ".".join(map(str, t))


def _oracle(kind: str, base: Triple) -> tuple[str, Callable[[Triple], bool]]:
    """A spec and an independent membership test (npm semantics)."""
    major, minor, patch = base
    if kind == "exact":
        return _text(base), lambda v: v == base
    if kind == "any":
        return "*", lambda v: True
    if kind == "tilde":
        return f"~{_text(base)}", lambda v: base <= v < (major, minor + 1, 0)
    if kind == "caret":
        if major > 0:
            high: Triple = (major + 1, 0, 0)
        elif minor > 0:
            high = (0, minor + 1, 0)
        else:
            high = (0, 0, patch + 1)
        return f"^{_text(base)}", lambda v: base <= v < high
    if kind == "ge":
        return f">={_text(base)}", lambda v: v >= base
    return f"<{_text(base)}", lambda v: v < base


@settings(max_examples=300, deadline=None)
@given(
    available=st.dictionaries(
        triples, st.sampled_from(list(LifecycleState)), min_size=0, max_size=12
    ),
    kind=st.sampled_from(["exact", "any", "tilde", "caret", "ge", "lt"]),
    base=triples,
)
def test_resolution_is_the_newest_usable_match(
    available: dict[Triple, LifecycleState], kind: str, base: Triple
) -> None:
    spec, member = _oracle(kind, base)
    listed = [VersionInfo(version=_text(v), state=s) for v, s in available.items()]
    matching = {v: s for v, s in available.items() if member(v)}
    for state in (ACTIVE, DEPRECATED):
        usable = [v for v, s in matching.items() if s is state]
        if usable:
            resolution = resolve("core__x", spec, listed)
            assert resolution.version == _text(max(usable))
            assert matches(spec, resolution.version)
            assert bool(resolution.warnings) == (state is DEPRECATED)
            return
    with pytest.raises(ToolRemoved if matching else ToolVersionNotFound):
        resolve("core__x", spec, listed)


# --- sunset dates, successors and pins ------------------------------------------------

NOW = datetime(2026, 6, 1, tzinfo=UTC)
SUNSET = LifecycleState.SUNSET


def test_a_deprecated_version_names_its_successor_and_sunset_date() -> None:
    available = [
        VersionInfo(
            version="1.0.0",
            state=DEPRECATED,
            sunset_date=NOW + timedelta(days=30),
            deprecated_in_favor_of="core__y@3.0.0",
        ),
        VersionInfo(version="2.0.0", state=ACTIVE),
    ]
    resolution = resolve("core__x", "1.0.0", available, now=NOW)
    assert resolution.warnings == [
        "tool core__x@1.0.0 is deprecated; use core__y@3.0.0; sunset on 2026-07-01"
    ]


def test_past_its_sunset_date_a_deprecated_version_is_removed_for_callers() -> None:
    available = [
        VersionInfo(version="1.0.0", state=DEPRECATED, sunset_date=NOW - timedelta(seconds=1)),
        VersionInfo(version="2.0.0", state=ACTIVE),
    ]
    with pytest.raises(ToolRemoved, match=r"core__x@1\.0\.0 is past its sunset date.*use 2\.0\.0"):
        resolve("core__x", "^1", available, now=NOW)
    # Still resolvable for a tenant pinning it, with a warning saying so.
    pinned = resolve("core__x", "^1", available, now=NOW, pinned=frozenset({"1.0.0"}))
    assert pinned.version == "1.0.0"
    assert "runs only because this tenant's policy pins it" in pinned.warnings[0]


def test_a_sunset_with_a_future_date_is_still_a_deprecation() -> None:
    info = VersionInfo(version="1.0.0", state=SUNSET, sunset_date=NOW + timedelta(days=1))
    resolution = resolve("core__x", "1.0.0", [info], now=NOW)
    assert resolution.warnings == ["tool core__x@1.0.0 is deprecated; sunset on 2026-06-02"]


def test_a_range_skips_a_sunset_version_for_an_older_usable_one() -> None:
    available = [
        VersionInfo(version="1.0.0", state=DEPRECATED),
        VersionInfo(version="1.1.0", state=SUNSET),
    ]
    assert resolve("core__x", "^1", available, now=NOW).version == "1.0.0"


def test_a_pin_never_brings_back_a_removed_version() -> None:
    available = infos(("1.0.0", REMOVED), ("2.0.0", ACTIVE))
    with pytest.raises(ToolRemoved):
        resolve("core__x", "1.0.0", available, now=NOW, pinned=frozenset({"1.0.0"}))


@pytest.mark.parametrize(
    ("spec", "exact"),
    [
        ("1.2.3", "1.2.3"),
        ("=1.2.3", "1.2.3"),
        ("==1.2.3", "1.2.3"),
        ("^1.2.3", None),
        ("1.2", None),
    ],
)
def test_exact_versions_are_told_from_ranges(spec: str, exact: str | None) -> None:
    assert exact_version(spec) == exact


@pytest.mark.parametrize(
    ("state", "sunset", "expected"),
    [
        (ACTIVE, NOW - timedelta(days=1), ACTIVE),
        (DEPRECATED, None, DEPRECATED),
        (DEPRECATED, NOW, SUNSET),
        (SUNSET, None, SUNSET),
        (SUNSET, NOW + timedelta(days=1), DEPRECATED),
        (REMOVED, NOW + timedelta(days=1), REMOVED),
    ],
)
def test_the_state_in_force_follows_the_sunset_date(
    state: LifecycleState, sunset: datetime | None, expected: LifecycleState
) -> None:
    assert effective_state(state, NOW, sunset_date=sunset) is expected


@pytest.mark.parametrize(
    ("state", "deprecation", "sunset", "expected"),
    [
        (DEPRECATED, NOW + timedelta(days=1), None, ACTIVE),
        (DEPRECATED, NOW + timedelta(days=1), NOW + timedelta(days=30), ACTIVE),
        (SUNSET, NOW + timedelta(days=1), NOW + timedelta(days=30), ACTIVE),
        (DEPRECATED, NOW, NOW + timedelta(days=30), DEPRECATED),
        (DEPRECATED, NOW - timedelta(days=1), None, DEPRECATED),
        (DEPRECATED, NOW - timedelta(days=30), NOW, SUNSET),
        (REMOVED, NOW + timedelta(days=1), None, REMOVED),
    ],
)
def test_a_version_is_deprecated_only_from_its_deprecation_date(
    state: LifecycleState,
    deprecation: datetime,
    sunset: datetime | None,
    expected: LifecycleState,
) -> None:
    assert effective_state(state, NOW, deprecation_date=deprecation, sunset_date=sunset) is expected


def test_no_warning_before_the_deprecation_date_and_one_from_it() -> None:
    announced = VersionInfo(
        version="1.0.0",
        state=DEPRECATED,
        deprecation_date=NOW + timedelta(days=7),
        sunset_date=NOW + timedelta(days=60),
        deprecated_in_favor_of="2.0.0",
    )
    before = resolve("acme__x", "1.0.0", [announced], now=NOW)
    assert before.warnings == []
    on_the_day = resolve("acme__x", "1.0.0", [announced], now=NOW + timedelta(days=7))
    assert on_the_day.warnings == [
        "tool acme__x@1.0.0 is deprecated; use 2.0.0; sunset on 2026-07-31"
    ]
