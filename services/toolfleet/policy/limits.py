"""Limits only go down: a request's ``resource_limits`` checked against its tool (pure).

An agent may ask a call to run under less memory, CPU or time than the tool's manifest
and the fleet give it, never more: a higher ask is refused before anything is authorized
(``resource_exhausted``, not retryable, ``details`` naming the limit). The ceiling and the
check are :mod:`toolfleet.tools.limits`' own, so policy refuses exactly what the
executor would clamp.
"""

from __future__ import annotations

from toolfleet.contract.manifest import ToolManifest
from toolfleet.events.models import ResourceLimits
from toolfleet.tools.limits import (
    AgentLimits,
    CallCeiling,
    FleetLimits,
    ManifestDefaults,
    refuse_raised,
)


def check_resource_limits(
    asked: ResourceLimits, *, manifest: ToolManifest, fleet: FleetLimits
) -> None:
    """Refuse ``asked`` when any limit is above the manifest's (else the fleet's).

    Raises:
        LimitRaised: e.g. ``details={"limit": "memory_mb_limit", "asked": 8192,
            "allowed": 512}``.
    """
    defaults = manifest.resource_defaults
    refuse_raised(
        AgentLimits(
            memory_mb=asked.memory_mb_limit,
            cpu_millicores=asked.cpu_millicore_limit,
            timeout_s=asked.timeout_seconds,
        ),
        CallCeiling.of(
            defaults=ManifestDefaults(
                memory_mb=defaults.memory_mb_limit, cpu_millicores=defaults.cpu_millicore_limit
            ),
            fleet=fleet,
            timeout_s=manifest.timeout_seconds,
        ),
    )
