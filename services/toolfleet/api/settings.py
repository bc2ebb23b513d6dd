"""The HTTP API's own knobs (``TOOLFLEET_API_*``)."""

from __future__ import annotations

from pydantic import Field

from toolfleet.settings import FleetSettings


class ApiSettings(FleetSettings):
    """Settings of ``toolfleet api``: the fleet's, plus where to listen."""

    api_host: str = "127.0.0.1"
    """Interface the API binds to (``0.0.0.0`` in a container)."""
    api_port: int = Field(default=8080, ge=1, le=65_535)
    """TCP port the API listens on."""
    readiness_timeout_s: float = Field(default=1.0, gt=0, le=30)
    """How long ``/readyz`` waits for each of the broker, Redis and Postgres."""
