"""``TOOLFLEET_KAFKA_SECURITY_PROTOCOL=SSL`` end to end: toolfleet's admin client, producer
and consumer reach a broker only through TLS, with mutual authentication.

The dev broker has no TLS listener of its own that the fleet uses, so a TLS-terminating
proxy (:class:`~tests.support.tls.TlsProxy`) stands in front of a broker that advertises
the proxy's address: metadata sends every follow-up connection back through TLS.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError

from tests.support.servers import free_port
from tests.support.tls import Pki, TlsProxy, broker_behind, make_pki
from toolfleet.bus.admin import ensure_topics
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.producer import EventProducer
from toolfleet.events.codec import WireMessage
from toolfleet.events.types import TopicName, topic
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class TlsBroker:
    settings: FleetSettings
    proxy: TlsProxy
    pki: Pki


@pytest.fixture
async def tls_broker(tmp_path: Path) -> AsyncIterator[TlsBroker]:
    pki = make_pki(tmp_path / "pki")
    broker_port, proxy_port = free_port(), free_port()
    proxy = TlsProxy(pki, listen_port=proxy_port, upstream_port=broker_port)
    with broker_behind(listen_port=broker_port, advertised_port=proxy_port):
        await proxy.start()
        try:
            yield TlsBroker(
                settings=FleetSettings(
                    kafka_bootstrap=f"127.0.0.1:{proxy_port}",
                    kafka_security_protocol="SSL",
                    kafka_ssl_ca_file=pki.ca,
                    kafka_ssl_cert_file=pki.client_cert,
                    kafka_ssl_key_file=pki.client_key,
                    topic_prefix=f"tls{uuid.uuid4().hex[:6]}.",
                    topic_partitions=2,
                ),
                proxy=proxy,
                pki=pki,
            )
        finally:
            await proxy.stop()


async def test_a_producer_and_a_consumer_round_trip_over_tls(tls_broker: TlsBroker) -> None:
    settings = tls_broker.settings
    created = await ensure_topics(settings)  # the admin client, over TLS
    assert len(created) == len(TopicName)

    name = topic(settings.topic_prefix, TopicName.REQUESTED)
    producer = EventProducer(settings, client_id="tls-test")
    await producer.start()
    try:
        ack = await producer.send_wire(
            name, WireMessage(key=b"tenant-a", value=b"over tls", headers=[])
        )
        await ack
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer(
        **connection_kwargs(settings),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(name, p) for p in range(2)])
        received: list[tuple[bytes | None, bytes | None]] = []
        for _ in range(100):
            batch = await consumer.getmany(timeout_ms=200)
            received += [(r.key, r.value) for records in batch.values() for r in records]
            if received:
                break
    finally:
        await consumer.stop()
    assert received == [(b"tenant-a", b"over tls")]
    # bootstrap and leader connections of three clients all went through the handshake
    assert tls_broker.proxy.tls_connections >= 3


async def test_plaintext_and_an_untrusted_ca_are_refused(
    tls_broker: TlsBroker, tmp_path: Path
) -> None:
    base = tls_broker.settings
    plaintext = FleetSettings(kafka_bootstrap=base.kafka_bootstrap)
    other_ca = make_pki(tmp_path / "other", ca_name="someone else").ca
    untrusted = base.model_copy(update={"kafka_ssl_ca_file": other_ca})
    for settings in (plaintext, untrusted):
        admin = AIOKafkaAdminClient(**connection_kwargs(settings), request_timeout_ms=3000)
        with pytest.raises(KafkaConnectionError):
            await admin.start()
        await admin.close()
    assert tls_broker.proxy.tls_connections == 0
