"""toolfleet: an event-driven tool execution layer for AI agents, over Kafka."""

__version__ = "0.1.0"
