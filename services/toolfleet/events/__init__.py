"""Event models, envelope and codec: the wire contract, with no I/O."""

from toolfleet.events.codec import ContentMode, WireMessage, decode, encode
from toolfleet.events.envelope import Envelope, derived_event_id, new_event
from toolfleet.events.types import TERMINAL_TYPES, EventType, Source, TopicName, topic

__all__ = [
    "TERMINAL_TYPES",
    "ContentMode",
    "Envelope",
    "EventType",
    "Source",
    "TopicName",
    "WireMessage",
    "decode",
    "derived_event_id",
    "encode",
    "new_event",
    "topic",
]
