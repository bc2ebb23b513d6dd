"""The tool the chaos tests run (loaded by executors through ``TOOLFLEET_TOOL_MODULES``).

``chaos__steps`` sleeps step by step and checkpoints after each step, like
``core__long_running``, and counts what it does in a Redis *outside* the fleet (the URL
in ``CHAOS_COUNTER_REDIS_URL``), so the counts survive a restart of the fleet's Redis:

- ``chaos:{run_id}:steps`` (hash) ``{invocation_id}:{step}`` -> times the step started;
  a step is the tool's side effect, so any count above 1 is a step executed twice;
- ``chaos:{run_id}:runs`` (hash) ``{invocation_id}`` -> times the tool was entered;
- ``chaos:{run_id}:resumes`` (hash) ``{invocation_id}`` -> entries with a checkpoint.
"""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel, Field
from redis.asyncio import Redis

from toolfleet.errors import Cancelled
from toolfleet.events.models import Effect
from toolfleet.sdk import ToolContext, tool

# These tools run in the executor's loop: they reach Redis, which a sandbox cannot.
TOOLFLEET_ISOLATION = "none"

#: Environment variable naming the Redis the counters go to.
COUNTER_URL_ENV = "CHAOS_COUNTER_REDIS_URL"


class StepsInput(BaseModel):
    steps: int = Field(ge=1, le=100)
    step_seconds: float = Field(ge=0, le=60)
    run_id: str = Field(min_length=1, max_length=64)


class StepsOutput(BaseModel):
    steps_completed: int
    resumed_from_step: int | None


class _Counters:
    """One Redis client per executor process, opened on first use."""

    def __init__(self) -> None:
        self._client: Redis | None = None

    def client(self) -> Redis:
        if self._client is None:
            self._client = Redis.from_url(os.environ[COUNTER_URL_ENV])
        return self._client


_COUNTERS = _Counters()


def steps_key(run_id: str) -> str:
    return f"chaos:{run_id}:steps"


def runs_key(run_id: str) -> str:
    return f"chaos:{run_id}:runs"


def resumes_key(run_id: str) -> str:
    return f"chaos:{run_id}:resumes"


@tool(
    id="chaos__steps",
    version="1.0.0",
    effect=Effect.STATE_CHANGE,
    redaction_allowlist=["steps_completed", "resumed_from_step"],
    timeout_seconds=120,
    category="test",
    tags=["chaos", "checkpoint"],
)
async def steps(params: StepsInput, ctx: ToolContext) -> StepsOutput:
    """Runs ``steps`` counted steps of ``step_seconds``, checkpointing after each."""
    counters = _COUNTERS.client()
    state = ctx.resume_state()
    start = int(state["step"]) if state else 0
    await counters.hincrby(runs_key(params.run_id), ctx.invocation_id, 1)
    if state:
        await counters.hincrby(resumes_key(params.run_id), ctx.invocation_id, 1)
    for step in range(start, params.steps):
        if ctx.cancelled:
            raise Cancelled(f"cancelled after {step} of {params.steps} steps")
        # The step's side effect happens as it starts: a step begun twice ran twice.
        await counters.hincrby(steps_key(params.run_id), f"{ctx.invocation_id}:{step}", 1)
        await asyncio.sleep(params.step_seconds)
        done = step + 1
        await ctx.checkpoint(
            {"step": done},
            progress_percent=100.0 * done / params.steps,
            current_phase=f"step {done}/{params.steps}",
        )
    return StepsOutput(steps_completed=params.steps, resumed_from_step=start if state else None)


TOOLS = [steps]
