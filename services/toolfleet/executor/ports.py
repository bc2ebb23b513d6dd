"""Ports the executor's run shares between its stages (adapters live in ``handler.py``)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from toolfleet.events.envelope import Envelope
from toolfleet.events.types import TopicName


class Emitter(Protocol):
    """Publishes a lifecycle notification now; the returned awaitable is the broker's ack."""

    async def emit(self, topic: TopicName, envelope: Envelope) -> Awaitable[object]: ...
