"""Tools whose versions the lifecycle tests deprecate, sunset and remove (their own ids,
so no other test in the session sees the changes)."""

from __future__ import annotations

from pydantic import BaseModel

from toolfleet.sdk import ToolContext, tool


class Empty(BaseModel):
    pass


class Report(BaseModel):
    value: int


@tool(
    id="lc__report",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["value"],
    category="data",
    description="Monthly sales report, first edition.",
)
async def report_1(params: Empty, ctx: ToolContext) -> Report:
    return Report(value=1)


@tool(
    id="lc__report",
    version="2.0.0",
    effect="read_only",
    redaction_allowlist=["value"],
    category="data",
    description="Monthly sales report.",
)
async def report_2(params: Empty, ctx: ToolContext) -> Report:
    return Report(value=2)
