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
    sync_invoke_wait_s: float = Field(default=30.0, ge=0, le=60)
    """How long ``POST /v1/invocations`` with ``execution_options.async_mode: false``
    waits for the outcome before answering ``202`` (``Prefer: wait=N`` overrides, up to
    60)."""
    sync_invoke_recheck_s: float = Field(default=1.0, gt=0, le=60)
    """While a synchronous invoke waits, how often it reads the status again without a
    notice (the notice from status normally wakes it at once)."""
    mcp_call_wait_s: float = Field(default=300.0, gt=0, le=3_600)
    """How long an MCP ``tools/call`` at ``/mcp`` follows its invocation before answering
    with a handle to poll (``status: running``) instead of the outcome."""
