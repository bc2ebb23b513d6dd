"""The built-in tools of the contract (section 7): always registered."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, Field

from toolfleet.errors import Cancelled, InvalidParameters
from toolfleet.events.models import Effect
from toolfleet.isolation.builtin import run_python
from toolfleet.tools.context import ToolContext
from toolfleet.tools.spec import tool


class TimeInput(BaseModel):
    timezone: str | None = Field(
        default=None, max_length=64, description="IANA zone, e.g. Europe/Paris"
    )


class TimeOutput(BaseModel):
    iso: str
    epoch_ms: int
    timezone: str


@tool(
    id="core__get_current_time",
    version="1.0.0",
    effect=Effect.READ_ONLY,
    redaction_allowlist=["iso", "epoch_ms", "timezone"],
    timeout_seconds=5,
    category="core",
    tags=["time", "demo"],
)
async def get_current_time(params: TimeInput, ctx: ToolContext) -> TimeOutput:
    """The current time, in UTC or the given IANA time zone."""
    name = params.timezone or "UTC"
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidParameters(
            "unknown time zone",
            details={"errors": [{"field": "timezone", "message": "unknown IANA time zone"}]},
        ) from None
    now = datetime.now(UTC)
    return TimeOutput(
        iso=now.astimezone(zone).isoformat(), epoch_ms=int(now.timestamp() * 1000), timezone=name
    )


class EchoInput(BaseModel):
    message: str = Field(max_length=100_000)


class EchoOutput(BaseModel):
    message: str
    length: int


@tool(
    id="core__echo",
    version="1.0.0",
    effect=Effect.READ_ONLY,
    redaction_allowlist=["message", "length"],
    timeout_seconds=5,
    category="core",
    tags=["demo"],
)
async def echo(params: EchoInput, ctx: ToolContext) -> EchoOutput:
    """Returns the message and its length."""
    return EchoOutput(message=params.message, length=len(params.message))


class LongRunningInput(BaseModel):
    steps: int = Field(ge=1, le=10_000)
    step_seconds: float = Field(ge=0, le=3_600)


class LongRunningOutput(BaseModel):
    steps_completed: int
    resumed_from_step: int | None


@tool(
    id="core__long_running",
    version="1.0.0",
    effect=Effect.READ_ONLY,
    redaction_allowlist=["steps_completed", "resumed_from_step"],
    timeout_seconds=3_600,
    category="core",
    tags=["demo", "checkpoint"],
)
async def long_running(params: LongRunningInput, ctx: ToolContext) -> LongRunningOutput:
    """Sleeps step by step, checkpointing after each; resumes from the last checkpoint."""
    state = ctx.resume_state()
    start = int(state["step"]) if state else 0
    for step in range(start, params.steps):
        if ctx.cancelled:
            raise Cancelled(f"cancelled after {step} of {params.steps} steps")
        deadline = time.monotonic() + params.step_seconds
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        done = step + 1
        await ctx.checkpoint(
            {"step": done},
            progress_percent=100.0 * done / params.steps,
            current_phase=f"step {done}/{params.steps}",
        )
    return LongRunningOutput(
        steps_completed=params.steps, resumed_from_step=start if state else None
    )


TOOLS = [get_current_time, echo, long_running, run_python]
"""``core__run_python`` lives with the sandbox it needs (:mod:`toolfleet.isolation.builtin`)."""
