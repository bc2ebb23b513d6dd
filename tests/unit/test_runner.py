"""One tool run: results, typed failures, timeouts; nothing of the exception leaks."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from toolfleet.errors import ErrorCode, ExternalApiError
from toolfleet.executor.leasing.fencing import Fence, StaleLease
from toolfleet.executor.runner import run_tool
from toolfleet.tools.context import CheckpointInput, ToolContext
from toolfleet.tools.spec import spec_of, tool

pytestmark = pytest.mark.unit


class In(BaseModel):
    mode: str


class Out(BaseModel):
    ok: bool


@tool(id="unit__t", version="1.0.0", effect="read_only", redaction_allowlist=["ok"])
async def t(params: In, ctx: ToolContext) -> Out:
    if params.mode == "slow":
        await asyncio.sleep(10)
    if params.mode == "external":
        raise ExternalApiError("upstream 503", retry_after_s=2)
    if params.mode == "crash":
        raise KeyError("secret-value")
    return Out(ok=True)


def ctx() -> ToolContext:
    return ToolContext(
        tenant_id="t", agent_did="a", invocation_id="i", tool_id="unit__t", tool_version="1.0.0"
    )


async def test_ok() -> None:
    assert (await run_tool(spec_of(t), {"mode": "fast"}, ctx(), timeout_s=1)).result == {"ok": True}


async def test_timeout() -> None:
    run = await run_tool(spec_of(t), {"mode": "slow"}, ctx(), timeout_s=0.05)
    assert run.error is not None
    assert run.error.code is ErrorCode.TIMEOUT


async def test_typed_errors_keep_their_code_and_retry_hint() -> None:
    run = await run_tool(spec_of(t), {"mode": "external"}, ctx(), timeout_s=1)
    assert run.error is not None
    assert (run.error.code, run.error.retryable, run.error.retry_after_s) == (
        ErrorCode.EXTERNAL_API_ERROR,
        True,
        2,
    )


async def test_unexpected_exceptions_leak_only_their_type() -> None:
    run = await run_tool(spec_of(t), {"mode": "crash"}, ctx(), timeout_s=1)
    assert run.error is not None
    assert run.error.code is ErrorCode.TOOL_EXECUTION_ERROR
    assert "secret-value" not in run.error.model_dump_json()
    assert "KeyError" in run.error.message


async def test_invalid_parameters() -> None:
    run = await run_tool(spec_of(t), {"mode": 3}, ctx(), timeout_s=1)
    assert run.error is not None
    assert run.error.code is ErrorCode.INVALID_PARAMETERS
    assert run.error.details["errors"][0]["field"] == "mode"


class _LostLease:
    """A checkpoint sink whose store says another worker owns the call now."""

    async def save(self, checkpoint: CheckpointInput) -> str:
        raise StaleLease(Fence("i", 1))


@tool(id="unit__checkpointer", version="1.0.0", effect="read_only", redaction_allowlist=["ok"])
async def checkpointer(params: In, ctx: ToolContext) -> Out:
    await ctx.checkpoint({"step": 1})
    return Out(ok=True)


async def test_a_lost_lease_discards_the_run_instead_of_reporting_it() -> None:
    # Not an outcome of this run (state_conflict): the call's new owner reports one.
    lost = ToolContext(
        tenant_id="t",
        agent_did="a",
        invocation_id="i",
        tool_id="unit__checkpointer",
        tool_version="1.0.0",
        checkpoints=_LostLease(),
    )
    with pytest.raises(StaleLease):
        await run_tool(spec_of(checkpointer), {"mode": "fast"}, lost, timeout_s=1)
