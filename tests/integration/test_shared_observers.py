"""``toolfleet worker audit+status``: both observers in one process, reading the
lifecycle topics once, against the real broker, Redis and Postgres."""

from __future__ import annotations

import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.support.eventually import eventually
from tests.support.lifecycle import Lifecycle
from tests.support.pipeline import running_services
from toolfleet.auth.outcomes import OutcomeSigner
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.events import routing
from toolfleet.events.codec import ContentMode, decode
from toolfleet.events.models import AuditRecord, InvocationStatus
from toolfleet.events.types import TOPIC_OF_TYPE, EventType, TopicName, topic
from toolfleet.settings import FleetSettings
from toolfleet.status.store import PostgresProjection

pytestmark = pytest.mark.integration


async def _committed(settings: FleetSettings, group: str) -> int:
    """Records the group has committed on the lifecycle topics."""
    names = [topic(settings.topic_prefix, name) for name in routing.AUDIT_CONSUMER.topics]
    parts = [TopicPartition(n, p) for n in names for p in range(settings.topic_partitions)]
    reader = AIOKafkaConsumer(
        **connection_kwargs(settings), group_id=f"{settings.topic_prefix}{group}"
    )
    await reader.start()
    try:
        return sum([await reader.committed(tp) or 0 for tp in parts])
    finally:
        await reader.stop()


async def test_one_process_audits_and_projects_every_lifecycle_event_it_reads_once(
    settings: FleetSettings,
) -> None:
    local = settings.model_copy(
        update={"topic_prefix": f"{settings.topic_prefix}ob{uuid.uuid4().hex[:6]}."}
    )
    lc = Lifecycle(parameters={"message": "hi", "password": "hunter2-very-secret"})
    events = [lc.requested(), lc.authorized(), lc.invoked(), lc.executed(), lc.outcome()]
    async with running_services(local, ["status+audit"]) as (res,):
        # Plays the services that end calls: their outcomes are signed.
        producer = EventProducer(local, before_send=OutcomeSigner.from_settings(local).seal)
        await producer.start()
        try:
            for i, env in enumerate(events):
                name = TOPIC_OF_TYPE[EventType(env.type)]
                mode = (ContentMode.BINARY, ContentMode.STRUCTURED)[i % 2]
                await producer.send(
                    Outbound(envelope=env, topic=topic(local.topic_prefix, name), mode=mode)
                )
        finally:
            await producer.stop()

        store = PostgresProjection(res.pool)

        async def projected() -> bool:
            # Every event folded: the outcome (results topic) and the request (requests
            # topic, where the parameters come from) are read in no set order.
            row = await store.get(lc.invocation_id)
            return (
                row is not None
                and row.status is InvocationStatus.SUCCESS
                and row.parameters is not None
            )

        await eventually(projected, timeout=30)
        row = await store.get(lc.invocation_id)
        assert row is not None
        assert row.parameters == {"message": "hi", "password": "[REDACTED]"}

        audits = AIOKafkaConsumer(
            topic(local.topic_prefix, TopicName.AUDIT),
            **connection_kwargs(local),
            auto_offset_reset="earliest",
            fetch_max_wait_ms=5,
        )
        await audits.start()
        seen: dict[str, str] = {}
        try:

            async def all_audited() -> bool:
                batch = await audits.getmany(timeout_ms=100)
                for records in batch.values():
                    for r in records:
                        event = decode(key=r.key, value=r.value, headers=list(r.headers))
                        source = AuditRecord.model_validate(event.data).source_event
                        seen[source.id] = event.id
                return set(seen) == {e.id for e in events}

            await eventually(all_audited, timeout=30)
        finally:
            await audits.stop()
        assert len(set(seen.values())) == len(events)  # one audit event per lifecycle event

        # One group for both, named the same whatever order the process was named in.
        async def committed() -> bool:
            return await _committed(local, "audit+status") >= len(events)

        await eventually(committed, timeout=30)
    assert await _committed(local, "audit") == 0
    assert await _committed(local, "status") == 0
