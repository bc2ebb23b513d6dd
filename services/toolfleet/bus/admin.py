"""Creates toolfleet's topics (idempotent) with the configured partitions."""

from __future__ import annotations

import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from toolfleet.events.types import TopicName, topic
from toolfleet.settings import FleetSettings

log = logging.getLogger(__name__)


def all_topics(settings: FleetSettings) -> list[str]:
    return [topic(settings.topic_prefix, name) for name in TopicName]


async def ensure_topics(settings: FleetSettings) -> list[str]:
    """Create every contract topic that does not exist yet; return the ones created."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [t for t in all_topics(settings) if t not in existing]
        if missing:
            await admin.create_topics(
                [
                    NewTopic(t, settings.topic_partitions, settings.topic_replication)
                    for t in missing
                ]
            )
            log.info("created topics", extra={"topics": missing})
        return missing
    finally:
        await admin.close()
