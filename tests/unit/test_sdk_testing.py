"""The tool authors' testing kit: a local run refuses, runs and redacts like the fleet."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel, Field

from toolfleet.errors import Cancelled, ErrorCode, PermissionDenied
from toolfleet.events.models import InvocationStatus
from toolfleet.registry.redaction import REDACTED
from toolfleet.sdk import Sandbox, ToolContext, ToolPermissions, spec_of, tool
from toolfleet.sdk.testing import CheckpointRecorder, context_for, run_tool

pytestmark = pytest.mark.unit

CALLS: list[str] = []


class LookupIn(BaseModel):
    user: str = Field(max_length=8)
    mode: str = "ok"


class Profile(BaseModel):
    name: str
    email: str


class LookupOut(BaseModel):
    user: str
    profile: Profile
    score: int


@tool(
    id="acme__lookup",
    version="1.2.0",
    effect="read_only",
    redaction_allowlist=["user", "profile.name"],
    timeout_seconds=5,
)
async def lookup(params: LookupIn, ctx: ToolContext) -> LookupOut:
    """Looks a user up."""
    CALLS.append(params.user)
    if params.mode == "crash":
        raise KeyError("the-internal-detail")
    if params.mode == "hang":
        await asyncio.Event().wait()
    if params.mode == "checkpoint":
        await ctx.checkpoint({"step": 1}, progress_percent=50, current_phase="half")
    if params.mode == "cancel" and ctx.cancelled:
        raise Cancelled("stopped on request")
    if params.mode == "wrong":
        return {"user": params.user, "profile": {"name": 1}}  # type: ignore[return-value]
    return LookupOut(
        user=params.user, profile=Profile(name="Ada", email="ada@example.com"), score=7
    )


class Empty(BaseModel):
    pass


class Said(BaseModel):
    said: str


@tool(
    id="acme__chatty",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["said"],
    sandbox=Sandbox(permissions=ToolPermissions(credentials=["api_key"])),
)
async def chatty(params: Empty, ctx: ToolContext) -> Said:
    return Said(said=f"my key is {ctx.credential('api_key').reveal()}")


async def test_the_result_is_redacted_to_the_allowlist() -> None:
    run = await run_tool(lookup, {"user": "ada"})
    assert run.ok
    assert run.status is InvocationStatus.SUCCESS
    assert run.result == {
        "user": "ada",
        "profile": {"name": "Ada", "email": REDACTED},
        "score": REDACTED,
    }
    assert run.raw_result is not None
    assert run.raw_result["profile"]["email"] == "ada@example.com"


async def test_parameters_failing_the_input_schema_never_reach_the_tool() -> None:
    CALLS.clear()
    run = await run_tool(lookup, {"user": "much-too-long-a-name"})
    assert run.status is InvocationStatus.ERROR
    assert run.error is not None
    assert run.error.code is ErrorCode.INVALID_PARAMETERS
    assert [e["field"] for e in run.error.details["errors"]] == ["user"]
    assert "much-too-long" not in run.error.model_dump_json()  # values are never quoted
    assert CALLS == []


async def test_a_missing_parameter_is_named() -> None:
    run = await run_tool(lookup, {})
    assert run.error is not None
    assert run.error.code is ErrorCode.INVALID_PARAMETERS
    assert "user" in run.error.details["errors"][0]["message"]


async def test_a_result_outside_the_output_schema_fails_validation() -> None:
    run = await run_tool(lookup, {"user": "ada", "mode": "wrong"})
    assert run.error is not None
    assert run.error.code is ErrorCode.RESULT_VALIDATION_FAILED
    assert run.result is None


async def test_an_unexpected_exception_leaks_its_type_only() -> None:
    run = await run_tool(lookup, {"user": "ada", "mode": "crash"})
    assert run.error is not None
    assert run.error.code is ErrorCode.TOOL_EXECUTION_ERROR
    assert "KeyError" in run.error.message
    assert "the-internal-detail" not in run.error.model_dump_json()


async def test_the_timeout_ends_the_run() -> None:
    run = await run_tool(lookup, {"user": "ada", "mode": "hang"}, timeout_s=0.01)
    assert run.status is InvocationStatus.TIMEOUT
    assert run.error is not None
    assert run.error.code is ErrorCode.TIMEOUT


async def test_checkpoints_are_recorded() -> None:
    run = await run_tool(lookup, {"user": "ada", "mode": "checkpoint"})
    assert run.ok
    assert [(c.state, c.progress_percent, c.current_phase) for c in run.checkpoints] == [
        ({"step": 1}, 50.0, "half")
    ]


async def test_a_context_of_ones_own() -> None:
    recorder = CheckpointRecorder()
    cancel = asyncio.Event()
    cancel.set()
    ctx = context_for(
        lookup,
        tenant_id="tenant_acme",
        invocation_id="inv-1",
        attempt=2,
        resume_state={"step": 4},
        checkpoints=recorder,
        cancel_event=cancel,
    )
    assert (ctx.tenant_id, ctx.invocation_id, ctx.tool_id, ctx.tool_version, ctx.attempt) == (
        "tenant_acme",
        "inv-1",
        "acme__lookup",
        "1.2.0",
        2,
    )
    assert ctx.resume_state() == {"step": 4}
    assert ctx.cancelled
    run = await run_tool(lookup, {"user": "ada", "mode": "cancel"}, ctx=ctx)
    assert run.status is InvocationStatus.CANCELLED

    # The decorated function is still the function: call it directly with the context.
    out = await lookup(LookupIn(user="bob", mode="checkpoint"), ctx)
    assert out.user == "bob"
    assert recorder.latest_state == {"step": 1}


async def test_credentials_resolve_only_when_declared() -> None:
    ctx = context_for(chatty, credentials={"api_key": "k-123"})
    assert ctx.credential("api_key").reveal() == "k-123"
    assert ctx.connection_id == "test"
    with pytest.raises(PermissionDenied):
        ctx.credential("other")
    with pytest.raises(PermissionDenied):
        context_for(chatty).credential("api_key")
    with pytest.raises(ValueError, match="does not declare"):
        context_for(lookup, credentials={"api_key": "x"})


async def test_output_carrying_a_credential_is_withheld() -> None:
    run = await run_tool(chatty, {}, credentials={"api_key": "sk_live_7Hq2x9Lm4Pz8"})
    assert run.error is not None
    assert run.error.code is ErrorCode.REDACTION_FAILED
    assert run.result is None
    assert "sk_live" not in repr(run)


async def test_a_spec_runs_as_its_function_does() -> None:
    run = await run_tool(spec_of(lookup), {"user": "ada"})
    assert run.ok
