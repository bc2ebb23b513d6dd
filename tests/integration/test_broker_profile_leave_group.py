"""How a stopping consumer leaves its group, by broker profile, as the broker sees it.

``kafka``: LeaveGroup, so the group forgets the member at once and its partitions move
without waiting for the session timeout. ``dev``: no LeaveGroup (the dev broker wedges a
group whose leader leaves mid-rebalance): the member stays until its session times out.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import cast

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from tests.support.eventually import eventually
from toolfleet.bus.admin import ensure_topics
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.bus.profile import BrokerProfile, KafkaProfile
from toolfleet.bus.runtime import ConsumerSpec, EventConsumer, Inbound
from toolfleet.devstack.broker_profile import DevBrokerProfile
from toolfleet.events.types import TopicName, topic
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration


async def _nothing(_: Inbound) -> Sequence[Outbound]:
    return []


async def _group(settings: FleetSettings, group: str) -> tuple[str, int]:
    """The group's state and member count, as the broker reports them."""
    admin = AIOKafkaAdminClient(**connection_kwargs(settings))
    await admin.start()
    try:
        [described] = await admin.describe_consumer_groups([group])
        [entry] = described.to_object()["groups"]
        return entry["state"], len(entry["members"])
    finally:
        await admin.close()


async def _members_after_a_stop(settings: FleetSettings, profile: BrokerProfile) -> int:
    """Members the broker still counts right after one of a stable group of two stopped.

    Two members: aiokafka sends LeaveGroup only from a generation past the first, and
    the dev broker numbers a group's first generation 0; the second member's join makes
    generation 1."""
    await ensure_topics(settings)
    group = f"{settings.topic_prefix}leave-{uuid.uuid4().hex[:6]}"
    spec = ConsumerSpec(
        service="leave",
        source="/toolfleet/test",
        group_id=group,
        topics=[topic(settings.topic_prefix, TopicName.CONTROL)],
    )
    members = [
        EventConsumer(
            spec,
            _nothing,
            settings=settings,
            producer=cast(EventProducer, None),  # it handles nothing, so it sends nothing
            processed=None,
            dlq_topic=topic(settings.topic_prefix, TopicName.DLQ),
            profile=profile,
        )
        for _ in range(2)
    ]
    stops = [asyncio.Event() for _ in members]
    first = asyncio.create_task(members[0].run(stops[0]))
    await asyncio.wait_for(members[0].assigned.wait(), 60)
    second = asyncio.create_task(members[1].run(stops[1]))
    try:
        await asyncio.wait_for(members[1].assigned.wait(), 60)

        async def stable_with_two() -> bool:
            return await _group(settings, group) == ("Stable", 2)

        await eventually(stable_with_two, timeout=30)
        stops[1].set()
        await second
        _, left = await _group(settings, group)
    finally:
        for stop in stops:
            stop.set()
        await asyncio.gather(first, second, return_exceptions=True)
    return left


async def test_a_kafka_profile_consumer_leaves_its_group_on_stop(settings: FleetSettings) -> None:
    # The consumer side of the kafka profile only: the dev broker lacks the idempotent
    # producer, so no kafka-profile producer runs here.
    kafka = settings.model_copy(
        update={"broker_profile": "kafka", "fetch_max_wait_ms": 500, "session_timeout_ms": 2000}
    )
    assert await _members_after_a_stop(kafka, KafkaProfile(kafka)) == 1


async def test_a_dev_profile_consumer_stays_a_member_until_its_session_times_out(
    settings: FleetSettings,
) -> None:
    dev = settings.model_copy(update={"session_timeout_ms": 2000})
    # The member is still there right after the stop: its session lasts 2 s more.
    assert await _members_after_a_stop(dev, DevBrokerProfile(dev)) == 2
