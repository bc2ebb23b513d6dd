"""Ports the executor's run shares between its stages (adapters live in ``handler.py``)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from toolfleet.events.envelope import Envelope
from toolfleet.events.types import TopicName
from toolfleet.tools.spec import ToolSpec


class Emitter(Protocol):
    """Publishes a lifecycle notification now; the returned awaitable is the broker's ack."""

    async def emit(self, topic: TopicName, envelope: Envelope) -> Awaitable[object]: ...


class ToolProvider(Protocol):
    """Tools not deployed as code (MCP servers, HTTP APIs): a spec on demand, or None."""

    async def spec(self, tool_id: str, version: str) -> ToolSpec | None: ...
