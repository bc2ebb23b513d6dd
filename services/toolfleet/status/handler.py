"""Kafka adapter of status: every lifecycle event in, a ``tool_invocations`` row updated.

Emits nothing to Kafka; after each terminal outcome is stored it publishes a Redis
notice (:mod:`toolfleet.storage.notices`) for synchronous HTTP invokes. Dedupe happens
twice on purpose: the runtime's Redis marker skips most redeliveries cheaply,
``projected_events`` makes the write itself exactly-once.
"""

from __future__ import annotations

from collections.abc import Sequence

from toolfleet.bus.producer import Outbound
from toolfleet.bus.runtime import ByBatch, EventConsumer, Inbound
from toolfleet.events import routing
from toolfleet.status.service import StatusProjector
from toolfleet.status.store import PostgresProjection
from toolfleet.storage.notices import RedisFinishedNotices
from toolfleet.worker import Resources


async def build(res: Resources) -> list[EventConsumer]:
    projector = StatusProjector(
        projection=PostgresProjection(res.pool), notices=RedisFinishedNotices(res.redis)
    )

    async def handle(events: Sequence[Inbound]) -> Sequence[Outbound]:
        await projector.on_events([event.envelope for event in events])
        return []

    spec = res.observer_spec(routing.STATUS_CONSUMER)
    # Projection is idempotent in Postgres (projected_events): no Redis dedupe needed.
    return [res.consumer(spec, ByBatch(handle), dedupe=False)]
