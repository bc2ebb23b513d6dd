"""Kafka adapter of status: every lifecycle event in, a ``tool_invocations`` row updated.

Emits nothing to Kafka but DLQ records (a request keyed by another tenant than it
names is one, ``key_tenant_mismatch``, and projects nothing) and the refusals of
outcomes without a valid signature (``ai.agent.tool.outcome.refused``: projected
nowhere, audited; :mod:`toolfleet.auth.outcomes`); after each terminal
outcome is stored it publishes a Redis notice (:mod:`toolfleet.storage.notices`) for
synchronous HTTP invokes. Dedupe happens
twice on purpose: the runtime's Redis marker skips most redeliveries cheaply,
``projected_events`` makes the write itself exactly-once.
"""

from __future__ import annotations

from collections.abc import Sequence

from toolfleet.auth.outcomes import OutcomeVerifier, screen
from toolfleet.bus.producer import Outbound
from toolfleet.bus.runtime import ByBatch, EventConsumer, Inbound
from toolfleet.events import routing
from toolfleet.events.types import Source
from toolfleet.status.service import StatusProjector
from toolfleet.status.store import PostgresProjection
from toolfleet.storage.notices import RedisFinishedNotices
from toolfleet.worker import Resources


async def build(res: Resources) -> list[EventConsumer]:
    projector = StatusProjector(
        projection=PostgresProjection(res.pool), notices=RedisFinishedNotices(res.redis)
    )

    # Outcomes nobody of the fleet signed are never projected (a forged ``succeeded``
    # would end a call that waits for approval); each one is audited instead.
    outcomes = OutcomeVerifier.from_settings(res.settings)

    async def handle(events: Sequence[Inbound]) -> Sequence[Outbound]:
        screened = screen(outcomes, [event.envelope for event in events], Source.STATUS)
        kept = [event for event, ok in zip(events, screened.trusted, strict=True) if ok]
        await projector.on_events([event.envelope for event in kept], [event.key for event in kept])
        return [Outbound(envelope=env, topic=res.topic(name)) for name, env in screened.refusals]

    spec = res.observer_spec(routing.STATUS_CONSUMER)
    # Projection is idempotent in Postgres (projected_events): no Redis dedupe needed.
    return [res.consumer(spec, ByBatch(handle), dedupe=False)]
