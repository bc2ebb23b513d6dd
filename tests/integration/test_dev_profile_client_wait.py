"""The dev profile waits between fetches in the client, on the real dev broker.

The dev broker spends CPU for as long as it holds a fetch, so it holds one for
``fetch_broker_wait_ms`` (1 ms) and the consumer waits the rest of ``fetch_max_wait_ms``
itself; a doorbell ring ends that wait at once.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from toolfleet.devstack.broker_profile.client_wait import fetch_waits, wait_in_client
from toolfleet.devstack.broker_profile.doorbell import FetchPace

pytestmark = pytest.mark.integration


@pytest.fixture
async def topic(kafka_bootstrap: str) -> AsyncIterator[str]:
    name = f"fetchwait.{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
        yield name
    finally:
        await admin.close()


async def test_an_idle_consumer_waits_in_the_client_until_a_ring(
    kafka_bootstrap: str, topic: str
) -> None:
    at_broker_ms, in_client_s = fetch_waits(3000, 1)  # a long wait, to see where it happens
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=None,
        fetch_max_wait_ms=at_broker_ms,
        auto_offset_reset="latest",
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await consumer.start()
    await producer.start()
    try:
        pace = FetchPace(topics=[topic], idle_after_s=60, interval_s=60)
        wait_in_client(consumer, in_client_s, pace)
        assert await consumer.getmany(timeout_ms=300) == {}  # an empty fetch: it waits now

        await producer.send_and_wait(topic, b"hello")
        # The broker would answer a fetch within a millisecond; none is sent: the
        # consumer is in its own wait (three seconds) and the broker holds nothing.
        assert await consumer.getmany(timeout_ms=1000) == {}

        pace.ring()  # the producer's ring: the wait ends and the next fetch finds it
        batch = await consumer.getmany(timeout_ms=2000)
        assert [r.value for records in batch.values() for r in records] == [b"hello"]
    finally:
        await producer.stop()
        await consumer.stop()  # a consumer stopped in the middle of a wait stops cleanly
