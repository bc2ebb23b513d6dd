"""The consumer runtime against the real broker and Redis."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from redis.asyncio import Redis

from tests.support.eventually import eventually
from tests.support.groups import group_formed
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.dedupe import RedisProcessedEvents
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.bus.runtime import ByBatch, ConsumerSpec, EventConsumer, Handler, Inbound
from toolfleet.devstack.broker_profile import DevBrokerProfile
from toolfleet.events.codec import ContentMode, decode, encode
from toolfleet.events.envelope import Envelope, derived_event_id, new_event
from toolfleet.events.types import EventType, Source, TopicName, topic
from toolfleet.settings import FleetSettings
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration


async def _read_all(settings: FleetSettings, name: TopicName, *, want: int, timeout: float = 15):
    consumer = AIOKafkaConsumer(
        topic(settings.topic_prefix, name),
        **connection_kwargs(settings),
        auto_offset_reset="earliest",
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    got = []
    try:

        async def more():
            batch = await consumer.getmany(timeout_ms=100)
            for recs in batch.values():
                got.extend(recs)
            return len(got) >= want

        await eventually(more, timeout=timeout)
    finally:
        await consumer.stop()
    return got


@dataclass
class Rig:
    """Topics of its own, a raw producer to feed them, and Redis; :meth:`start` runs an
    :class:`EventConsumer` of its requests topic until the rig's block ends."""

    settings: FleetSettings
    requested: str
    group: str
    raw: AIOKafkaProducer
    redis: Redis
    producer: EventProducer
    stack: contextlib.AsyncExitStack
    seen: list[str] = field(default_factory=list)

    def start(
        self, handler: Handler | ByBatch, *, dedupe: bool = True
    ) -> Callable[[], Awaitable[None]]:
        """``dedupe``: skip what the group already processed (Redis markers), as the
        consumers of a handler that is not idempotent by itself do. Returns what stops
        the consumer before the rig's block ends (SIGTERM's path: drain, commit, close)."""
        runtime = EventConsumer(
            ConsumerSpec(
                service="test",
                source="/toolfleet/test",
                group_id=self.group,
                topics=[self.requested],
            ),
            handler,
            settings=self.settings,
            producer=self.producer,
            processed=(
                RedisProcessedEvents(self.redis, group=self.group, ttl_s=600) if dedupe else None
            ),
            dlq_topic=topic(self.settings.topic_prefix, TopicName.DLQ),
            profile=DevBrokerProfile(self.settings),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(runtime.run(stop))

        async def stopped() -> None:
            stop.set()
            await task

        self.stack.push_async_callback(stopped)
        return stopped

    def echo(self, *, dedupe: bool = True) -> Callable[[], Awaitable[None]]:
        """Start a consumer that answers each request with an authorized event."""

        async def handler(event: Inbound) -> Sequence[Outbound]:
            self.seen.append(event.envelope.id)
            return [_authorized_of(event, self.settings.topic_prefix)]

        return self.start(handler, dedupe=dedupe)


@contextlib.asynccontextmanager
async def rig(settings: FleetSettings) -> AsyncIterator[Rig]:
    from toolfleet.bus.admin import ensure_topics

    prefix = f"{settings.topic_prefix}rt{uuid.uuid4().hex[:6]}."
    local = settings.model_copy(update={"topic_prefix": prefix})
    await ensure_topics(local)
    async with contextlib.AsyncExitStack() as stack:
        producer = EventProducer(local)
        await producer.start()
        stack.push_async_callback(producer.stop)
        redis = connect_redis(local.redis_url)
        stack.push_async_callback(redis.aclose)
        raw = AIOKafkaProducer(**connection_kwargs(local))
        await raw.start()
        stack.push_async_callback(raw.stop)
        yield Rig(
            settings=local,
            requested=topic(prefix, TopicName.REQUESTED),
            group=f"g-{uuid.uuid4().hex[:6]}",
            raw=raw,
            redis=redis,
            producer=producer,
            stack=stack,
        )


async def test_forwards_dedupes_and_dead_letters(settings: FleetSettings) -> None:
    async with rig(settings) as echo:
        echo.echo()
        event = _request(1, "t1")
        structured = _request(2, "t2")
        req = echo.requested
        for env, mode in (
            (event, ContentMode.BINARY),
            (event, ContentMode.BINARY),
            (structured, ContentMode.STRUCTURED),
        ):
            wire = encode(env, mode)
            await echo.raw.send_and_wait(req, wire.value, key=wire.key, headers=wire.headers)
        await echo.raw.send_and_wait(req, b"\x00garbage", key=b"t1", headers=[("x", b"y")])
        outputs = await _read_all(echo.settings, TopicName.AUTHORIZED, want=2)
        dlq = await _read_all(echo.settings, TopicName.DLQ, want=1)
    seen = echo.seen

    # the duplicate (same source+id) was processed once; both content modes were accepted
    assert sorted(seen) == sorted([event.id, structured.id])
    decoded = [decode(key=r.key, value=r.value, headers=list(r.headers)) for r in outputs]
    assert {d.data["echo"]["n"] for d in decoded} == {1, 2}
    assert all(d.partitionkey == d.tenantid for d in decoded)
    record = decode(key=dlq[0].key, value=dlq[0].value, headers=list(dlq[0].headers))
    assert dict(dlq[0].headers)["content-type"] == b"application/cloudevents+json"
    assert dlq[0].key == b"t1"
    assert base64.b64decode(record.data["value_b64"]) == b"\x00garbage"
    assert record.data["error"]["code"] == "invalid_event"
    assert json.dumps(record.data)  # serializable for SIEMs


async def test_a_consumer_of_an_idempotent_handler_costs_no_dedupe_markers(
    settings: FleetSettings,
) -> None:
    async with rig(settings) as echo:
        echo.echo(dedupe=False)
        event = _request(1, "t1")
        wire = encode(event, ContentMode.BINARY)
        for copies in (1, 2):  # the copy once the first was handled (redelivered, say)
            await echo.raw.send_and_wait(
                echo.requested, wire.value, key=wire.key, headers=wire.headers
            )
            await _read_all(echo.settings, TopicName.AUTHORIZED, want=copies)
        markers = [key async for key in echo.redis.scan_iter(match=f"dedupe:{echo.group}:*")]
    assert echo.seen == [event.id, event.id]  # the handler sees the copy: no marker stops it
    assert markers == []


def _request(n: int, tenant: str) -> Envelope:
    return new_event(
        event_type=EventType.INVOKE_REQUESTED,
        source=Source.CLI,
        data={"n": n},
        tenant_id=tenant,
        invocation_id=str(uuid.uuid4()),
    )


def _authorized_of(event: Inbound, prefix: str) -> Outbound:
    out = new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data={"echo": event.envelope.data},
        tenant_id=event.envelope.tenantid or "",
        invocation_id=event.envelope.invocationid,
        event_id=derived_event_id(event.envelope, EventType.INVOKE_AUTHORIZED),
        parent=event.envelope,
    )
    return Outbound(envelope=out, topic=topic(prefix, TopicName.AUTHORIZED))


async def test_a_batch_consumer_handles_a_fetch_at_once_and_isolates_a_bad_record(
    settings: FleetSettings,
) -> None:
    """ByBatch (audit, status): the records of a fetch reach the handler together; a
    duplicate is skipped, a transient failure retried, and a record the handler cannot
    handle is dead-lettered alone while the rest of its batch goes through; every offset
    is committed."""
    batches: list[list[int]] = []
    failed_once = False
    async with rig(settings) as batch_rig:
        local, req = batch_rig.settings, batch_rig.requested
        prefix = local.topic_prefix

        async def handle(events: Sequence[Inbound]) -> Sequence[Outbound]:
            nonlocal failed_once
            numbers = [int(e.envelope.data["n"]) for e in events]
            batches.append(numbers)
            if not failed_once:
                failed_once = True
                raise ConnectionError("Redis went away for a moment")  # transient: retried
            if 7 in numbers:
                raise ValueError("cannot handle record 7")
            return [_authorized_of(e, prefix) for e in events]

        raw = batch_rig.raw
        sent = []
        for n in range(12):
            env = _request(n, "t1")  # one tenant, one partition: one fetch holds them all
            sent.append(env)
            wire = encode(env, ContentMode.BINARY)
            await raw.send_and_wait(req, wire.value, key=wire.key, headers=wire.headers)
        twin = encode(sent[3], ContentMode.STRUCTURED)  # the same event again: a duplicate
        await raw.send_and_wait(req, twin.value, key=twin.key, headers=twin.headers)
        await raw.send_and_wait(req, b"\x00garbage", key=b"t1", headers=[("x", b"y")])
        batch_rig.start(ByBatch(handle))
        outputs = await _read_all(local, TopicName.AUTHORIZED, want=11)
        dlq = await _read_all(local, TopicName.DLQ, want=2)
    group = batch_rig.group

    echoed = sorted(
        decode(key=r.key, value=r.value, headers=list(r.headers)).data["echo"]["n"] for r in outputs
    )
    assert echoed == [n for n in range(12) if n != 7]  # the duplicate of 3 went out once
    assert max(len(b) for b in batches) > 1  # handled together, not one by one
    codes = sorted(
        decode(key=r.key, value=r.value, headers=list(r.headers)).data["error"]["code"] for r in dlq
    )
    assert codes == ["internal_error", "invalid_event"]
    check = AIOKafkaConsumer(**connection_kwargs(local), group_id=group)
    await check.start()
    try:
        parts = [TopicPartition(req, p) for p in range(local.topic_partitions)]
        ends = await check.end_offsets(parts)
        committed = {tp: await check.committed(tp) for tp in parts}
    finally:
        await check.stop()
    assert all((committed[tp] or 0) == ends[tp] for tp in parts)  # nothing left behind


class SilentBroker:
    """Accepts connections and never answers: a consumer's start (which waits for the
    group to assign it partitions) would wait 40 s for its first reply."""

    def __init__(self) -> None:
        self.connections = 0
        self.connected = asyncio.Event()
        self._hang_up = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def _never_answer(self, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.connected.set()
        await self._hang_up.wait()
        writer.close()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._never_answer, "127.0.0.1", 0)
        return f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *_: object) -> None:
        self._hang_up.set()
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()


def _consumer_of(local: FleetSettings) -> EventConsumer:
    async def unreachable_handler(_: Inbound) -> Sequence[Outbound]:
        raise AssertionError("nothing can be fetched from a broker that never answers")

    return EventConsumer(
        ConsumerSpec(service="test", source="/toolfleet/test", group_id="g-joining", topics=["t"]),
        unreachable_handler,
        settings=local,
        producer=EventProducer(local),
        processed=None,
        dlq_topic="dlq",
        profile=DevBrokerProfile(local),
    )


async def test_a_group_whose_leader_stops_while_another_member_joins_reads_on(
    settings: FleetSettings,
) -> None:
    """The dev broker keeps a leader that sends LeaveGroup mid-rebalance as the group's
    leader, and no member is assigned a partition again (a clean bounce of the leading
    executor while another one starts). A stopping worker of the dev profile does not
    send it: its session times out, and the group reforms."""
    quick = settings.model_copy(update={"session_timeout_ms": 2000})
    async with rig(quick) as group:
        stop_leader = group.echo()  # first in the group: its leader
        await _served(group, "before")
        group.echo()
        await asyncio.sleep(4)  # the second member joined; the group is stable again
        group.echo()  # a third joins: the group rebalances...
        await group_formed(group.settings, group.group, members=3, timeout=15)
        await stop_leader()  # ...and its leader stops meanwhile
        # Its session times out (2 s) and the group reforms: served in 4-5 s here. With
        # LeaveGroup the group went on rebalancing without a leader for 8 to 27 s
        # (for more than 150 s in a CI run).
        await _served(group, "after", timeout=12)


async def _served(group: Rig, tag: str, *, timeout: float = 15) -> None:
    """A request on every partition of the requests topic is answered."""
    partitions = group.settings.topic_partitions
    ids = []
    for partition in range(partitions):
        event = _request(partition, f"{tag}-{partition}")
        wire = encode(event, ContentMode.BINARY)
        await group.raw.send_and_wait(
            group.requested, wire.value, key=wire.key, headers=wire.headers, partition=partition
        )
        ids.append(event.id)

    async def answered() -> bool:
        return set(ids) <= set(group.seen)

    await eventually(answered, timeout=timeout)


async def test_a_stop_while_joining_the_group_ends_the_consumer_without_the_join(
    settings: FleetSettings,
) -> None:
    broker = SilentBroker()
    async with broker as bootstrap:
        runtime = _consumer_of(settings.model_copy(update={"kafka_bootstrap": bootstrap}))
        stop = asyncio.Event()
        running = asyncio.create_task(runtime.run(stop))
        await asyncio.wait_for(broker.connected.wait(), timeout=10)
        stop.set()  # what SIGTERM does
        # Far below the 40 s the join would hold it: the stop did not wait for the join.
        await asyncio.wait_for(running, timeout=10)
    assert not runtime.assigned.is_set()


async def test_the_outputs_of_a_fetch_leave_in_one_produce_request(
    settings: FleetSettings,
) -> None:
    """Sixty structured events of 4 KB for one partition (audit's output for one fetch)
    go to the broker together, not a produce round trip per 16 KB (aiokafka's default
    batch), and every one lands."""
    prefix = f"{settings.topic_prefix}pb{uuid.uuid4().hex[:6]}."
    local = settings.model_copy(update={"topic_prefix": prefix})
    from toolfleet.bus.admin import ensure_topics

    await ensure_topics(local)
    audit = topic(prefix, TopicName.AUDIT)
    outbounds = [
        Outbound(
            envelope=new_event(
                event_type=EventType.INVOKE_AUTHORIZED,
                source=Source.AUDIT,
                data={"n": n, "padding": "x" * 4096},
                tenant_id="tenant-one-partition",
                invocation_id=str(uuid.uuid4()),
            ),
            topic=audit,
            mode=ContentMode.STRUCTURED,
        )
        for n in range(60)
    ]
    producer = EventProducer(local)
    await producer.start()
    requests: list[str] = []
    client = producer._producer.client
    send = client.send

    async def counting(node_id: int, request: object, **kwargs: object) -> object:
        requests.append(type(request).__name__)
        return await send(node_id, request, **kwargs)

    try:
        await producer.partitions_for(audit)  # metadata first: its requests are not counted
        client.send = counting
        await producer.send_all(outbounds)
    finally:
        client.send = send
        await producer.stop()
    produced = [name for name in requests if name.startswith("ProduceRequest")]
    assert len(produced) == 1, requests
    got = await _read_all(local, TopicName.AUDIT, want=60)
    assert sorted(json.loads(r.value)["data"]["n"] for r in got) == list(range(60))
