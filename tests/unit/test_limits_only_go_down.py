"""Limits only go down (issue 32): a request's ``resource_limits`` may lower the
manifest's and the fleet's limits, never raise them; policy refuses, the executor clamps."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolfleet.contract.manifest import ResourceDefaults, ToolManifest
from toolfleet.errors import ErrorCode
from toolfleet.events.models import ResourceLimits
from toolfleet.policy.limits import check_resource_limits
from toolfleet.tools.limits import (
    AgentLimits,
    CallCeiling,
    FleetLimits,
    LimitRaised,
    ManifestDefaults,
    ToolLimits,
    bound_limits,
    clamp,
    refuse_raised,
)

pytestmark = pytest.mark.unit

FLEET = FleetLimits(memory_mb=512, cpu_millicores=1000)


def manifest(**fields: Any) -> ToolManifest:
    values: dict[str, Any] = {
        "tool_id": "acme__tool",
        "version": "1.0.0",
        "effect": "read_only",
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
        "redaction_allowlist": [],
        "timeout_seconds": 30,
    }
    return ToolManifest(**{**values, **fields})


@pytest.mark.parametrize(
    ("asked", "limit", "allowed"),
    [
        (ResourceLimits(memory_mb_limit=8192), "memory_mb_limit", 512),
        (ResourceLimits(cpu_millicore_limit=4000), "cpu_millicore_limit", 1000),
        (ResourceLimits(timeout_seconds=31), "timeout_seconds", 30),
    ],
)
def test_a_higher_ask_is_refused_naming_the_limit(
    asked: ResourceLimits, limit: str, allowed: int
) -> None:
    with pytest.raises(LimitRaised) as refused:
        check_resource_limits(asked, manifest=manifest(), fleet=FLEET)
    error = refused.value.to_error_info()
    assert error.code is ErrorCode.RESOURCE_EXHAUSTED
    assert not error.retryable
    assert error.details["limit"] == limit
    assert error.details["allowed"] == allowed
    assert limit in error.message


def test_the_manifests_defaults_are_the_ceiling_where_set() -> None:
    tool = manifest(resource_defaults=ResourceDefaults(memory_mb_limit=256))
    check_resource_limits(ResourceLimits(memory_mb_limit=256), manifest=tool, fleet=FLEET)
    with pytest.raises(LimitRaised) as refused:
        check_resource_limits(ResourceLimits(memory_mb_limit=300), manifest=tool, fleet=FLEET)
    assert refused.value.details == {"limit": "memory_mb_limit", "asked": 300, "allowed": 256}
    # A manifest that needs more than the fleet's default: asking that much lowers nothing.
    big = manifest(resource_defaults=ResourceDefaults(memory_mb_limit=2048))
    check_resource_limits(ResourceLimits(memory_mb_limit=2048), manifest=big, fleet=FLEET)


def test_lower_or_no_asks_pass() -> None:
    for asked in (
        ResourceLimits(),
        ResourceLimits(memory_mb_limit=512, cpu_millicore_limit=1000, timeout_seconds=30),
        ResourceLimits(memory_mb_limit=64, cpu_millicore_limit=1, timeout_seconds=0.5),
    ):
        check_resource_limits(asked, manifest=manifest(), fleet=FLEET)


def test_the_executor_clamps_what_an_authorized_event_asks_above_the_ceiling() -> None:
    run = bound_limits(
        tool_id="t",
        tool=ToolLimits(),
        agent=AgentLimits(memory_mb=8192, cpu_millicores=64_000),
        fleet=FLEET,
        timeout_s=10,
    )
    assert run.memory_mb == 512
    assert run.cpu_seconds == 10  # 1000 millicores for 10 s, not 64 cores' worth
    below = bound_limits(
        tool_id="t",
        tool=ToolLimits(),
        agent=AgentLimits(memory_mb=8192),
        fleet=FLEET,
        timeout_s=10,
        defaults=ManifestDefaults(memory_mb=200),
    )
    assert below.memory_mb == 200


limit_values = st.one_of(st.none(), st.integers(1, 1 << 20))


@given(
    asked_mb=limit_values,
    asked_cpu=limit_values,
    default_mb=limit_values,
    default_cpu=limit_values,
    fleet_mb=st.integers(16, 1 << 16),
    fleet_cpu=st.integers(1, 1 << 16),
)
def test_policy_refuses_exactly_what_the_executor_would_have_to_clamp(
    asked_mb: int | None,
    asked_cpu: int | None,
    default_mb: int | None,
    default_cpu: int | None,
    fleet_mb: int,
    fleet_cpu: int,
) -> None:
    asked = AgentLimits(memory_mb=asked_mb, cpu_millicores=asked_cpu)
    ceiling = CallCeiling.of(
        defaults=ManifestDefaults(memory_mb=default_mb, cpu_millicores=default_cpu),
        fleet=FleetLimits(memory_mb=fleet_mb, cpu_millicores=fleet_cpu),
    )
    clamped = clamp(asked, ceiling)
    try:
        refuse_raised(asked, ceiling)
    except LimitRaised:
        assert clamped != asked
    else:
        assert clamped == asked
    assert clamped.memory_mb is None or clamped.memory_mb <= ceiling.memory_mb
    assert clamped.cpu_millicores is None or clamped.cpu_millicores <= ceiling.cpu_millicores
