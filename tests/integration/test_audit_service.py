"""The audit service in-process against the real broker and Redis."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord

from tests.support.eventually import eventually
from tests.support.lifecycle import Lifecycle
from tests.support.pipeline import running_services
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.events.codec import ContentMode, decode
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import AuditRecord, InvocationStatus
from toolfleet.events.types import TOPIC_OF_TYPE, EventType, TopicName, topic
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration

SECRETS = (
    "hunter2-very-secret",
    "alice@example.com",
    "eyJhbGciOiJSUzI1NiJ9",  # the capability token's header
    "AKIAIOSFODNN7EXAMPLE",
    "4111 1111 1111 1111",
)


@dataclass
class AuditFleet:
    settings: FleetSettings
    producer: EventProducer

    async def publish(self, env: Envelope, mode: ContentMode = ContentMode.BINARY) -> None:
        name = TOPIC_OF_TYPE[EventType(env.type)]
        await self.producer.send(
            Outbound(envelope=env, topic=topic(self.settings.topic_prefix, name), mode=mode)
        )


@pytest.fixture(scope="module")
async def fleet(settings: FleetSettings) -> AsyncIterator[AuditFleet]:
    local = settings.model_copy(
        update={"topic_prefix": f"{settings.topic_prefix}au{uuid.uuid4().hex[:6]}."}
    )
    async with running_services(local, ["audit"]):
        producer = EventProducer(local)
        await producer.start()
        try:
            yield AuditFleet(settings=local, producer=producer)
        finally:
            await producer.stop()


async def _audit_records(
    fleet: AuditFleet, invocation_id: str, *, want: int
) -> list[ConsumerRecord[bytes, bytes]]:
    consumer = AIOKafkaConsumer(
        topic(fleet.settings.topic_prefix, TopicName.AUDIT),
        **connection_kwargs(fleet.settings),
        auto_offset_reset="earliest",
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    got: list[ConsumerRecord[bytes, bytes]] = []
    try:

        async def enough() -> bool:
            batch = await consumer.getmany(timeout_ms=100)
            for records in batch.values():
                got.extend(r for r in records if invocation_id.encode() in (r.value or b""))
            return (
                len({decode(key=r.key, value=r.value, headers=list(r.headers)).id for r in got})
                >= want
            )

        await eventually(enough, timeout=30)
    finally:
        await consumer.stop()
    return got


async def test_one_structured_sanitized_audit_event_per_lifecycle_event(fleet: AuditFleet) -> None:
    lc = Lifecycle(
        parameters={
            "message": "hello",
            "password": SECRETS[0],
            "notes": [{"contact": f"write to {SECRETS[1]}"}, f"key {SECRETS[3]}"],
            "card": SECRETS[4],
        }
    )
    events = [
        (lc.requested(), ContentMode.BINARY),
        (lc.authorized(), ContentMode.STRUCTURED),
        (lc.invoked(), ContentMode.BINARY),
        (lc.checkpoint(50, "half"), ContentMode.STRUCTURED),
        (lc.executed(), ContentMode.BINARY),
        (lc.outcome(InvocationStatus.SUCCESS), ContentMode.STRUCTURED),
        (lc.cancel_requested(), ContentMode.BINARY),
    ]
    for env, mode in events:
        await fleet.publish(env, mode)
    await fleet.publish(events[0][0], ContentMode.STRUCTURED)  # a re-send: same source+id

    records = await _audit_records(fleet, lc.invocation_id, want=len(events))

    audits = [decode(key=r.key, value=r.value, headers=list(r.headers)) for r in records]
    by_source: dict[str, set[str]] = {}
    for audit in audits:
        data = AuditRecord.model_validate(audit.data)
        by_source.setdefault(data.source_event.id, set()).add(audit.id)
    sources = {env.id: env for env, _ in events}
    assert set(by_source) == set(sources)
    assert all(len(ids) == 1 for ids in by_source.values())  # re-sends collapse to one id

    for record, audit in zip(records, audits, strict=True):
        headers = dict(record.headers)
        assert headers["content-type"].startswith(b"application/cloudevents+json")
        assert not any(name.startswith("ce_") for name in headers)
        assert record.key == lc.tenant.encode()
        for secret in (*SECRETS, "capability_token"):
            assert secret.encode() not in record.value
        data = AuditRecord.model_validate(audit.data)
        source = sources[data.source_event.id]
        assert audit.type == source.type
        assert audit.source == "/toolfleet/audit"
        assert audit.traceparent == lc.traceparent
        assert audit.tenantid == lc.tenant
        assert audit.invocationid == lc.invocation_id
        assert data.ocsf["class_uid"] == 6003
        assert data.ocsf["type_uid"] == 600300 + data.ocsf["activity_id"]
        assert data.ocsf["metadata"]["correlation_uid"] == lc.invocation_id
    succeeded = next(a for a in audits if a.type == EventType.SUCCEEDED)
    assert '"length"' not in succeeded.model_dump_json()  # no result body, only metadata
    requested = AuditRecord.model_validate(
        next(a for a in audits if a.type == EventType.INVOKE_REQUESTED).data
    )
    assert requested.parameters is not None
    assert requested.parameters["password"] == "[REDACTED]"
    assert requested.parameters["message"] == "hello"
