"""Waiting in the client: the dev profile moves the wait between fetches off the broker.

The dev broker spends CPU for as long as it holds a fetch
that found nothing (it polls its logs meanwhile, more so the more partitions the fetch
names): measured, a fetch held 5 ms costs it 0.6-1.4 ms of CPU, one held 1 ms 0.2-0.5
ms, and at ``fetch_max_wait_ms=0`` it answers without reading at all. So the broker holds
a fetch for at most ``TOOLFLEET_FETCH_BROKER_WAIT_MS`` (1 ms) and the consumer waits the
rest of ``fetch_max_wait_ms`` itself (:func:`wait_in_client`), before its next fetch;
a ring cuts that wait short. A Kafka that long-polls wakes a held fetch the moment a
record lands: its profile (``kafka``) waits at the broker only, and none of this runs.

A fetch known to find records is held longer at the broker (``fetch_found_wait_ms``):
the dev broker keeps every record batch it was ever sent in memory
and takes the longer to find a fetch's offset the more batches its partition holds
(measured on one partition, a new record at the end of 0 / 3,000 / 10,000 one-record
batches: 1.6 / 4.7 / 10.9 ms with the longer hold; held 1 ms, the fetch at 3,000 came
back empty every time and the record was never read). The broker answers such a fetch
as soon as it has read the records, so the longer hold costs nothing when they are
there, and a fetch nobody knows to find anything keeps the short one.

aiokafka has no public hook for either: :func:`wait_in_client` wraps the fetcher's
private ``_proc_fetch_request`` (aiokafka 0.10-0.14) and raises a fetch request's
private ``_max_wait_ms`` (0.14; a request without it is sent as built). This is why it
lives in the dev profile, the only package allowed to touch aiokafka's private
attributes (``tests/unit/test_no_private_aiokafka.py``); with an aiokafka that changes
them, consumers of the dev profile wait at the broker only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.consumer.fetcher import Fetcher

from toolfleet.devstack.broker_profile.doorbell import FetchPace, behind_reported_end

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
    consumer: AIOKafkaConsumer,
    seconds: float,
    pace: FetchPace | None = None,
    *,
    found_wait_ms: int = 0,
) -> None:
    """After a fetch that brought no records, ``consumer`` waits ``seconds`` before it
    sends the next (cut short by ``pace``'s rings): the wait between fetches moves from
    the broker to the client (see the module's notes). A fetch known to find records (an
    offset before the partition's end as the broker last reported it) may be held
    ``found_wait_ms`` at the broker instead (0: as built). Call it once ``consumer``
    started.

    aiokafka fetches in a background task, one request per broker in flight, the next
    as soon as the last is answered; the wait is added to that request's task, so the
    broker stays *in flight* for it and no other fetch is sent meanwhile.
    """
    fetcher = getattr(consumer, "_fetcher", None)
    if (seconds <= 0 and found_wait_ms <= 0) or fetcher is None or not _FETCHER_HOOK:
        return
    proc = fetcher._proc_fetch_request

    async def send(assignment: Any, node_id: int, request: Any, *, behind: bool) -> bool:
        if behind:
            _hold_at_broker(request, found_wait_ms)
        return bool(await proc(assignment, node_id, request))

    async def fetch_then_wait(assignment: Any, node_id: int, request: Any) -> bool:
        offsets, ends = _positions(assignment, request)
        # Known to find records only by the broker's own word (the end its last answer
        # reported), never by a ring: a ring naming records never written (Redis is
        # the doorbell's, not the broker's) must not make the broker hold a fetch.
        behind = behind_reported_end(offsets, ends)
        try:
            if pace is None:
                found = await send(assignment, node_id, request, behind=behind)
                if not found:
                    await asyncio.sleep(seconds)
                return found
            since = pace.rings
            if not pace.critical:
                # An observer: at most one fetch every ``seconds``, rings or not.
                await asyncio.sleep(pace.spacing(seconds))
                return await send(assignment, node_id, request, behind=behind)
            if pace.exact and not pace.owed(offsets, assignment.tps, ends):
                if await pace.hold(since=since) or getattr(fetcher, "_closed", False):
                    return False  # rung, or partitions freed: the fetcher builds it anew
                since = pace.rings
            found = await send(assignment, node_id, request, behind=behind)
            if found:
                return True
            if getattr(fetcher, "_closed", False):
                return False
            if not pace.exact or _owed(pace, assignment, request):  # ends as now reported
                await pace.between_fetches(seconds, since=since)
        except asyncio.CancelledError:
            # Only the fetcher cancels its requests (closing, or the assignment changed)
            # and awaits them afterwards; like aiokafka's own, end as an empty fetch.
            return False
        return False

    fetcher._proc_fetch_request = fetch_then_wait


def _positions(
    assignment: Any, request: Any
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int | None]]:
    """A fetch request's offsets (read as aiokafka's fetcher reads it) and the high
    watermarks the assignment's last fetches reported (None before any)."""
    offsets = {
        TopicPartition(topic, partition): offset
        for topic, partitions in request.topics
        for partition, offset, *_ in partitions
    }
    ends = {tp: getattr(assignment.state_value(tp), "highwater", None) for tp in offsets}
    return offsets, ends


def _owed(pace: FetchPace, assignment: Any, request: Any) -> bool:
    """:meth:`FetchPace.owed` of a fetch request."""
    offsets, ends = _positions(assignment, request)
    return pace.owed(offsets, assignment.tps, ends)


def _hold_at_broker(request: Any, ms: int) -> None:
    """Let the broker hold ``request`` up to ``ms`` (never shorter than it was built; a
    request without aiokafka 0.14's ``_max_wait_ms`` is sent as built). A fixed bound,
    not one that grows when such a fetch still comes back empty: a fetch wrongly taken
    for known would then hold up every partition of its consumer for longer each time,
    while one this deep costs the dev broker 100 ms per fetch (about 90,000 batches)."""
    built = getattr(request, "_max_wait_ms", None)
    if ms > 0 and isinstance(built, int) and built < ms:
        request._max_wait_ms = ms
