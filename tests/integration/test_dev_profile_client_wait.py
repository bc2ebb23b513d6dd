"""The dev profile waits between fetches in the client, on the real dev broker.

The dev broker spends CPU for as long as it holds a fetch, so it holds one for
``fetch_broker_wait_ms`` (1 ms) and the consumer waits the rest of ``fetch_max_wait_ms``
itself. A ring ends that wait at once for a consumer on the critical path; an
observer (audit, status) fetches at most once per wait, rings or not.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import ConsumerRecord

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


class WatchedPace(FetchPace):
    """A :class:`FetchPace` that tells when its consumer begins a wait between fetches."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.waiting = asyncio.Event()

    async def between_fetches(self, seconds: float, *, since: int) -> None:
        self.waiting.set()
        await super().between_fetches(seconds, since=since)

    def spacing(self, seconds: float) -> float:
        wait = super().spacing(seconds)
        if wait > 0:
            self.waiting.set()
        return wait


@asynccontextmanager
async def waiting_consumer(
    kafka_bootstrap: str, topic: str, pace: WatchedPace
) -> AsyncIterator[tuple[AIOKafkaConsumer, AIOKafkaProducer]]:
    """A consumer of ``topic`` that waits three seconds in the client after an empty
    fetch, and a producer.

    Its fetches are held up to 200 ms at the broker, not the profile's 1 ms: a dev broker
    holding many partitions (the suite's other fleets) may answer a 1 ms fetch before it
    has read the topic, and the next fetch would then come only after the three-second
    wait this test makes long on purpose (under the profile's 5 ms, a fetch later)."""
    at_broker_ms, in_client_s = fetch_waits(3000, 200)  # a long wait, to see where it is
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
        wait_in_client(consumer, in_client_s, pace)
        assert await consumer.getmany(timeout_ms=300) == {}
        await asyncio.wait_for(pace.waiting.wait(), 10)  # an empty fetch: it waits now
        yield consumer, producer
    finally:
        await producer.stop()
        await consumer.stop()  # a consumer stopped in the middle of a wait stops cleanly


def values(batch: dict[object, list[ConsumerRecord[bytes, bytes]]]) -> list[bytes | None]:
    return [r.value for records in batch.values() for r in records]


async def test_an_idle_consumer_on_the_critical_path_waits_in_the_client_until_a_ring(
    kafka_bootstrap: str, topic: str
) -> None:
    # No wake delay and a fast window: a consumer on the critical path (policy, executor).
    pace = WatchedPace(topics=[topic], idle_after_s=60, interval_s=60, fast_window_s=0.01)
    assert pace.critical
    async with waiting_consumer(kafka_bootstrap, topic, pace) as (consumer, producer):
        await producer.send_and_wait(topic, b"hello")
        # The broker would answer a fetch within a millisecond; none is sent: the
        # consumer is in its own wait (three seconds) and the broker holds nothing.
        assert await consumer.getmany(timeout_ms=1000) == {}

        pace.ring()  # the producer's ring: the wait ends and the next fetch finds it
        # Within a second of the ring, long before the three-second wait would end.
        assert values(await consumer.getmany(timeout_ms=1000)) == [b"hello"]


async def test_an_observer_fetches_once_per_wait_whatever_rings(
    kafka_bootstrap: str, topic: str
) -> None:
    pace = WatchedPace(topics=[topic], idle_after_s=60, interval_s=60, wake_delay_s=0.5)
    assert not pace.critical
    async with waiting_consumer(kafka_bootstrap, topic, pace) as (consumer, producer):
        await producer.send_and_wait(topic, b"hello")
        pace.ring()  # an observer's fetches are spaced: one fetch collects several hops
        assert await consumer.getmany(timeout_ms=1000) == {}
        # The next fetch, three seconds after the last, brings it.
        assert values(await consumer.getmany(timeout_ms=4000)) == [b"hello"]


DEEP = 6000
"""One-record batches in a partition: deeper than the dev broker reads in a millisecond."""


async def test_a_record_at_the_end_of_a_deep_partition_is_read(
    kafka_bootstrap: str, topic: str
) -> None:
    """The dev broker keeps every batch and takes the longer to find an offset the more
    batches the partition holds: held only the profile's 1 ms, a fetch at the end of a
    few thousand comes back empty, every time. Once a fetch reported the end past the
    consumer's offset, the next is known to find the record and is held up to 100 ms."""
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=0)
    await producer.start()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=None,
        fetch_max_wait_ms=1,
        auto_offset_reset="latest",
    )
    try:
        for _ in range(DEEP):  # one batch each: every send waits for its acknowledgement
            await producer.send_and_wait(topic, b"x")
        await consumer.start()
        wait_in_client(consumer, 0.004, found_wait_ms=100)
        assert await consumer.getmany(timeout_ms=300) == {}  # at the end

        await producer.send_and_wait(topic, b"last")
        read: list[bytes | None] = []
        async with asyncio.timeout(20):
            while not read:
                read = values(await consumer.getmany(timeout_ms=500))
        assert read == [b"last"]
    finally:
        await consumer.stop()
        await producer.stop()
