"""Tools an extra executor loads (``TOOLFLEET_TOOL_MODULES=tests.support.pool_tools``), as
the README's "run an executor with your own tools" does: the ``acme__*`` tools are in
the executor pool ``acme`` (the module's default), ``extra__shout`` stays in ``default``
(only the extra executor has it: the standard executors of the pool hand its calls over),
``idle__wait`` is in a pool no executor serves (its calls wait, then time out)."""

from __future__ import annotations

import os

from pydantic import BaseModel

from toolfleet.sdk import ToolContext, tool

# Run in the executor's loop; every tool of this module is in the pool "acme" unless it
# says otherwise.
TOOLFLEET_ISOLATION = "none"
TOOLFLEET_POOL = "acme"


class City(BaseModel):
    city: str


class Forecast(BaseModel):
    city: str
    forecast: str
    tenant: str
    pid: int
    """The executor process that ran it."""


@tool(
    id="acme__weather",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["city", "forecast", "tenant", "pid"],
)
async def weather(params: City, ctx: ToolContext) -> Forecast:
    """The weather of a city (always sunny), and who ran the call."""
    return Forecast(city=params.city, forecast="sunny", tenant=ctx.tenant_id, pid=os.getpid())


class Text(BaseModel):
    text: str


class Shouted(BaseModel):
    text: str
    pid: int


@tool(
    id="extra__shout",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["text", "pid"],
    pool="default",
)
async def shout(params: Text, ctx: ToolContext) -> Shouted:
    """Upper-cases the text (a default-pool tool only the extra executor has)."""
    return Shouted(text=params.text.upper(), pid=os.getpid())


@tool(
    id="idle__wait",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["text", "pid"],
    timeout_seconds=3,
    pool="nobody",
)
async def wait(params: Text, ctx: ToolContext) -> Shouted:
    """In a pool no executor serves: its calls are queued until their deadline."""
    return Shouted(text=params.text, pid=os.getpid())
