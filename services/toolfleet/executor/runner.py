"""Runs one tool call: parameters in, result or typed error out (no I/O of its own).

The tool's own exceptions never escape: a :class:`ToolfleetError` keeps its code, a
timeout becomes ``timeout``, anything else ``tool_execution_error`` with the exception
type only (its message may hold data that must not leave the executor). The exception
is :class:`~toolfleet.executor.leasing.fencing.StaleLease` out of ``ctx.checkpoint()``: the
run lost its lease, and the lease guard discards it (the call's new owner reports).

:mod:`toolfleet.sdk.testing` runs tool authors' local calls through this same step.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from toolfleet.errors import (
    ErrorInfo,
    InvalidParameters,
    ToolExecutionError,
    ToolfleetError,
    ToolTimeout,
)
from toolfleet.events.envelope import field_errors
from toolfleet.executor.leasing.fencing import StaleLease
from toolfleet.isolation.run_states import Usage
from toolfleet.tools.context import ToolContext
from toolfleet.tools.spec import ToolSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    result: dict[str, Any] | None = None
    error: ErrorInfo | None = None
    usage: Usage | None = None
    """CPU and peak memory of an isolated run (None: it ran in the executor's loop)."""


async def run_tool(
    spec: ToolSpec, parameters: dict[str, Any], ctx: ToolContext, *, timeout_s: float
) -> RunResult:
    """Run ``spec`` with ``parameters`` under ``timeout_s``. Cancellation propagates."""
    try:
        params = spec.input_model.model_validate(parameters)
    except ValidationError as exc:
        return RunResult(
            error=InvalidParameters(
                "parameters do not match the tool's input model",
                details={"errors": field_errors(exc)},
            ).to_error_info()
        )
    try:
        async with asyncio.timeout(timeout_s):
            output = await spec.fn(params, ctx)
    except TimeoutError:
        return RunResult(
            error=ToolTimeout(
                f"{spec.tool_id} did not finish within {timeout_s:g}s", retry_after_s=None
            ).to_error_info()
        )
    except StaleLease:
        raise  # another worker owns the call: this run is discarded, not reported
    except ToolfleetError as exc:
        return RunResult(error=exc.to_error_info())
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.warning("tool raised", extra={"tool_id": spec.tool_id, "exc_type": type(exc).__name__})
        return RunResult(
            error=ToolExecutionError(f"{spec.tool_id} failed: {type(exc).__name__}").to_error_info()
        )
    return RunResult(result=_as_result(output))


def _as_result(output: object) -> dict[str, Any]:
    if isinstance(output, BaseModel):
        return output.model_dump(mode="json")
    if isinstance(output, dict):
        return output
    return {"value": output}
