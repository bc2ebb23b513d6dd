"""Kafka plumbing: producer, consumer runtime, offsets, dedupe, DLQ, topic admin."""

from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.bus.runtime import ConsumerSpec, EventConsumer, Inbound

__all__ = ["ConsumerSpec", "EventConsumer", "EventProducer", "Inbound", "Outbound"]
