"""Ports the executor's run shares between its stages (adapters live in ``handler.py``)."""

from __future__ import annotations

from typing import Protocol

from toolfleet.tools.spec import ToolSpec


class ToolProvider(Protocol):
    """Tools not deployed as code (MCP servers, HTTP APIs): a spec on demand, or None."""

    async def spec(self, tool_id: str, version: str) -> ToolSpec | None: ...
