"""What publishing returns and what waiting reports, shared by both transports."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class InvocationHandle:
    """What publishing an invoke returns."""

    invocation_id: str
    tenant_id: str
    event_id: str
    """The id of the ``invoke.requested`` event (empty when the HTTP API published it)."""
    traceparent: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Progress:
    """A non-terminal lifecycle event of an invocation, for progress displays."""

    invocation_id: str
    event_type: str
    progress_percent: float | None
    current_phase: str


ProgressCallback = Callable[[Progress], None]
