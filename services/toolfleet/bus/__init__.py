"""Kafka plumbing: producer, consumer runtime, offsets, dedupe, DLQ, topic admin.

Exports load on first use: the CLI reads ``bus.topics`` and ``bus.connection`` on a
core install, which has no aiokafka (the ``fleet`` extra).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolfleet.bus.producer import EventProducer, Outbound
    from toolfleet.bus.runtime import ConsumerSpec, EventConsumer, Inbound

_EXPORTS = {
    "ConsumerSpec": "toolfleet.bus.runtime",
    "EventConsumer": "toolfleet.bus.runtime",
    "EventProducer": "toolfleet.bus.producer",
    "Inbound": "toolfleet.bus.runtime",
    "Outbound": "toolfleet.bus.producer",
}

__all__ = ["ConsumerSpec", "EventConsumer", "EventProducer", "Inbound", "Outbound"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
