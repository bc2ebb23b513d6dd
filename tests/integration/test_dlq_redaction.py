"""Dead-lettered requests keep no live credential (contract 9, DLQ records).

A request that no consumer can decode is dead-lettered by every consumer that reads
``toolfleet.invoke.requested`` (policy, status, audit): each copy keeps the original
bytes except the capability token, replaced by ``"[redacted]"``, and its header
``toolfleet_redacted`` says so. The token in these requests is valid: before, each of
the three DLQ copies handed it to whoever reads the DLQ.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.dlq import REDACTED_HEADER
from toolfleet.events.types import TopicName
from toolfleet.settings import FleetSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

READERS = ("policy", "status", "audit")
"""Every service that reads ``invoke.requested``, each in its own consumer group."""
TENANT, AGENT = "t1", "did:agent:test"


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("dlq-redaction")
    async with in_process_fleet(fleet_settings(settings, home), READERS) as running:
        yield running


@dataclass(frozen=True)
class DeadLetter:
    group: str
    value: bytes
    """The dead-lettered record's value, as the DLQ record carries it."""
    redacted: str | None
    """Its ``toolfleet_redacted`` header."""


def request_data(token: str) -> dict[str, object]:
    return {
        "invocation_id": str(uuid.uuid4()),
        "tool_id": "core__echo",
        "agent_context": {"agent_did": AGENT, "tenant_id": TENANT},
        "parameters": {"message": "hello, dead letters"},
        "capability_token": token,
    }


async def send(fleet: Fleet, value: bytes, headers: list[tuple[str, bytes]]) -> tuple[int, int]:
    producer = AIOKafkaProducer(**connection_kwargs(fleet.settings))
    await producer.start()
    try:
        meta = await producer.send_and_wait(
            fleet.topic(TopicName.REQUESTED), value, key=TENANT.encode(), headers=headers
        )
    finally:
        await producer.stop()
    return meta.partition, meta.offset


async def dead_letters(fleet: Fleet, partition: int, offset: int) -> list[DeadLetter]:
    """Every DLQ copy of the record at ``partition``/``offset`` of the requests topic."""
    consumer = AIOKafkaConsumer(
        fleet.topic(TopicName.DLQ),
        **connection_kwargs(fleet.settings),
        auto_offset_reset="earliest",
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    found: list[DeadLetter] = []
    try:
        while batch := await consumer.getmany(timeout_ms=300):
            for records in batch.values():
                for r in records:
                    record = json.loads(r.value)["data"]
                    if (record["topic"], record["partition"], record["offset"]) != (
                        fleet.topic(TopicName.REQUESTED),
                        partition,
                        offset,
                    ):
                        continue
                    headers = dict(r.headers)
                    found.append(
                        DeadLetter(
                            group=record["consumer_group"],
                            value=base64.b64decode(record["value_b64"]),
                            redacted=(
                                headers[REDACTED_HEADER].decode()
                                if REDACTED_HEADER in headers
                                else None
                            ),
                        )
                    )
    finally:
        await consumer.stop()
    return found


async def every_reader_dead_letters(
    fleet: Fleet, value: bytes, headers: list[tuple[str, bytes]]
) -> list[DeadLetter]:
    partition, offset = await send(fleet, value, headers)

    async def all_copies() -> list[DeadLetter]:
        copies = await dead_letters(fleet, partition, offset)
        groups = {c.group.removeprefix(fleet.settings.topic_prefix) for c in copies}
        assert groups >= set(READERS), groups
        return copies

    return await eventually(all_copies, timeout=60, interval=0.3)


def binary_headers(**broken: bytes) -> list[tuple[str, bytes]]:
    headers = {
        "ce_specversion": b"1.0",
        "ce_id": str(uuid.uuid4()).encode(),
        "ce_source": b"toolfleet/client",
        "ce_type": b"ai.agent.tool.invoke.requested",
        "ce_tenantid": TENANT.encode(),
        "content-type": b"application/json",
        **broken,
    }
    return list(headers.items())


STRUCTURED = [("content-type", b"application/cloudevents+json; charset=UTF-8")]


async def test_a_binary_request_is_dead_lettered_with_its_token_redacted(fleet: Fleet) -> None:
    token = fleet.token(TENANT, AGENT)
    # Spaces after the separators: the bytes kept are the producer's, not a rewrite.
    value = json.dumps(request_data(token), separators=(", ", ": ")).encode()
    headers = binary_headers(ce_specversion=b"0.3")  # no consumer decodes the event

    copies = await every_reader_dead_letters(fleet, value, headers)

    expected = value.replace(json.dumps(token).encode(), b'"[redacted]"')
    for copy in copies:
        assert token.encode() not in copy.value, copy.group
        assert copy.value == expected, copy.group
        assert copy.redacted == "data.capability_token"


async def test_a_structured_request_that_is_no_event_is_dead_lettered_redacted(
    fleet: Fleet,
) -> None:
    token = fleet.token(TENANT, AGENT)
    event = {"specversion": "1.0", "type": "ai.agent.tool.invoke.requested"}  # no id, no source
    value = json.dumps({**event, "data": request_data(token)}, indent=1).encode()

    copies = await every_reader_dead_letters(fleet, value, STRUCTURED)

    expected = value.replace(json.dumps(token).encode(), b'"[redacted]"')
    for copy in copies:
        assert token.encode() not in copy.value, copy.group
        assert copy.value == expected, copy.group
        assert copy.redacted == "data.capability_token"


async def test_a_request_that_is_not_json_loses_every_jwt_shaped_run(fleet: Fleet) -> None:
    token = fleet.token(TENANT, AGENT)
    value = b"\xff\xfe not json; bearer " + token.encode() + b" and the rest"

    copies = await every_reader_dead_letters(fleet, value, STRUCTURED)

    for copy in copies:
        assert token.encode() not in copy.value, copy.group
        assert copy.value == b"\xff\xfe not json; bearer [redacted] and the rest"
        assert copy.redacted == "jwt"
