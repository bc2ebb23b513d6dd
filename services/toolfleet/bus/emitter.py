"""The port a stage publishes one event through, now (the executor's lifecycle events,
a source's run-time registrations); adapters wrap the fleet's producer."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from toolfleet.events.envelope import Envelope
from toolfleet.events.types import TopicName


class Emitter(Protocol):
    """Publishes ``envelope`` on ``topic`` now; the returned awaitable is the broker's ack."""

    async def emit(self, topic: TopicName, envelope: Envelope) -> Awaitable[object]: ...
