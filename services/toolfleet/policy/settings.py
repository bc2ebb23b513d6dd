"""Policy's own knobs."""

from __future__ import annotations

from pydantic import Field

from toolfleet.settings import FleetSettings


class PolicySettings(FleetSettings):
    approval_ttl_s: int = Field(default=24 * 3600, ge=60)
    """How long a call waits for a human before it is denied."""
    registry_cache_ttl_s: float = Field(default=5.0, ge=0)
    """How long a tool's versions are cached in process while the registry's change notices
    cannot reach it (its ``LISTEN`` connection is down); while they can, five minutes. 0
    turns the cache off: every call reads the registry."""
