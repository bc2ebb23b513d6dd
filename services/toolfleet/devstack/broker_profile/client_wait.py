"""Waiting in the client: the dev profile moves the wait between fetches off the broker.

The dev broker spends CPU for as long as it holds a fetch
that found nothing (it polls its logs meanwhile, more so the more partitions the fetch
names): measured, a fetch held 5 ms costs it 0.6-1.4 ms of CPU, one held 1 ms 0.2-0.5
ms, and at ``fetch_max_wait_ms=0`` it answers without reading at all. So the broker holds
a fetch for at most ``TOOLFLEET_FETCH_BROKER_WAIT_MS`` (1 ms) and the consumer waits the
rest of ``fetch_max_wait_ms`` itself (:func:`wait_in_client`), before its next fetch;
a ring cuts that wait short. A Kafka that long-polls wakes a held fetch the moment a
record lands: its profile (``kafka``) waits at the broker only, and none of this runs.

aiokafka has no public hook for it: :func:`wait_in_client` wraps the fetcher's private
``_proc_fetch_request`` (aiokafka 0.10-0.14). This is why it lives in the dev profile,
the only package allowed to touch aiokafka's private attributes
(``tests/unit/test_no_private_aiokafka.py``); with an aiokafka that changes it,
consumers of the dev profile wait at the broker only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.consumer.fetcher import Fetcher

from toolfleet.devstack.broker_profile.doorbell import FetchPace

_FETCHER_HOOK = callable(getattr(Fetcher, "_proc_fetch_request", None))
"""Whether this aiokafka's fetcher sends each fetch request in ``_proc_fetch_request``
(true of 0.10-0.14). If a release changes that, consumers wait at the broker only."""


def fetch_waits(max_wait_ms: int, broker_wait_ms: int) -> tuple[int, float]:
    """How a consumer waits for records: (``fetch_max_wait_ms`` of its fetch requests,
    seconds it waits itself after a fetch that brought none). Together, ``max_wait_ms``."""
    if not _FETCHER_HOOK:
        return max_wait_ms, 0.0
    at_broker = min(max_wait_ms, max(broker_wait_ms, 1))  # 0: the dev broker reads nothing
    return at_broker, (max_wait_ms - at_broker) / 1000


def wait_in_client(
    consumer: AIOKafkaConsumer, seconds: float, pace: FetchPace | None = None
) -> None:
    """After a fetch that brought no records, ``consumer`` waits ``seconds`` before it
    sends the next (cut short by ``pace``'s rings): the wait between fetches moves from
    the broker to the client (see the module's notes). Call it once ``consumer`` started.

    aiokafka fetches in a background task, one request per broker in flight, the next
    as soon as the last is answered; the wait is added to that request's task, so the
    broker stays *in flight* for it and no other fetch is sent meanwhile.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    if seconds <= 0 or fetcher is None or not _FETCHER_HOOK:
        return
    send = fetcher._proc_fetch_request

    async def fetch_then_wait(assignment: Any, node_id: int, request: Any) -> bool:
        try:
            if pace is None:
                found: bool = await send(assignment, node_id, request)
                if not found:
                    await asyncio.sleep(seconds)
                return found
            since = pace.rings
            if not pace.critical:
                # An observer: at most one fetch every ``seconds``, rings or not.
                await asyncio.sleep(pace.spacing(seconds))
                return bool(await send(assignment, node_id, request))
            if pace.exact and not _owed(pace, assignment, request):
                if await pace.hold(since=since) or getattr(fetcher, "_closed", False):
                    return False  # rung, or partitions freed: the fetcher builds it anew
                since = pace.rings
            found = await send(assignment, node_id, request)
            if found:
                return True
            if getattr(fetcher, "_closed", False):
                return False
            if not pace.exact or _owed(pace, assignment, request):
                await pace.between_fetches(seconds, since=since)
        except asyncio.CancelledError:
            # Only the fetcher cancels its requests (closing, or the assignment changed)
            # and awaits them afterwards; like aiokafka's own, end as an empty fetch.
            return False
        return False

    fetcher._proc_fetch_request = fetch_then_wait


def _owed(pace: FetchPace, assignment: Any, request: Any) -> bool:
    """:meth:`FetchPace.owed` of a fetch request (read as aiokafka's fetcher reads it),
    with the high watermarks the assignment's last fetches reported."""
    offsets = {
        TopicPartition(topic, partition): offset
        for topic, partitions in request.topics
        for partition, offset, *_ in partitions
    }
    ends = {tp: getattr(assignment.state_value(tp), "highwater", None) for tp in offsets}
    return pace.owed(offsets, assignment.tps, ends)
