"""Kafka adapter of audit: every lifecycle event in, one structured audit event out."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from toolfleet.audit.records import audit_event
from toolfleet.bus.producer import Outbound
from toolfleet.bus.runtime import ByBatch, EventConsumer, Inbound
from toolfleet.events import routing
from toolfleet.events.codec import ContentMode
from toolfleet.events.types import TopicName
from toolfleet.worker import Resources


async def build(res: Resources) -> list[EventConsumer]:
    audit_topic = res.topic(TopicName.AUDIT)

    async def handle(events: Sequence[Inbound]) -> Sequence[Outbound]:
        now = datetime.now(UTC)
        # Structured mode: SIEM connectors read the value and never see headers.
        return [
            Outbound(
                envelope=audit_event(event.envelope, topic=event.topic, now=now),
                topic=audit_topic,
                mode=ContentMode.STRUCTURED,
            )
            for event in events
        ]

    spec = res.observer_spec(routing.AUDIT_CONSUMER)
    return [res.consumer(spec, ByBatch(handle))]
