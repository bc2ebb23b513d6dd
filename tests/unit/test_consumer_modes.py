"""The consumer's modes, offline: how one fetch reaches a handler, and what is committable."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import pytest
from aiokafka import ConsumerRecord, TopicPartition

from tests.support.eventually import eventually
from toolfleet.bus.dedupe import ProcessedEvents
from toolfleet.bus.offsets import Partition
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.bus.profile import LongPolls
from toolfleet.bus.runtime import ByBatch, ConsumerSpec, EventConsumer, Handler, Inbound
from toolfleet.bus.scheduler import Placement
from toolfleet.events.codec import WireMessage, decode, encode
from toolfleet.events.envelope import new_event
from toolfleet.events.types import EventType, Source
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.unit


class _NoOutput:
    async def send_all(self, outputs: Sequence[Outbound]) -> None:
        assert not outputs


def _record(partition: int, offset: int) -> ConsumerRecord[bytes, bytes]:
    wire = encode(
        new_event(
            event_type=EventType.INVOKE_AUTHORIZED,
            source=Source.POLICY,
            data={},
            tenant_id="t",
            invocation_id=f"{partition}-{offset}",
        )
    )
    return ConsumerRecord(
        topic="t",
        partition=partition,
        offset=offset,
        timestamp=0,
        timestamp_type=0,
        key=wire.key,
        value=wire.value,
        checksum=None,
        serialized_key_size=0,
        serialized_value_size=len(wire.value),
        headers=wire.headers,
    )


def _consumer(
    handler: Handler | ByBatch,
    *,
    processed: ProcessedEvents | None = None,
    producer: object | None = None,
    **spec: Any,
) -> EventConsumer:
    return EventConsumer(
        ConsumerSpec(service="test", source="/toolfleet/test", group_id="g", topics=["t"], **spec),
        handler,
        settings=FleetSettings(),
        producer=cast(EventProducer, producer or _NoOutput()),
        processed=processed,
        dlq_topic="dlq",
    )


class _Markers:
    """The group's dedupe markers in memory, with every question and mark it was sent."""

    def __init__(self, *marked: str) -> None:
        self.marked = set(marked)
        self.questions: list[list[str]] = []
        self.marks: list[list[str]] = []

    async def seen(self, key: str) -> bool:
        return (await self.seen_all([key]))[0]

    async def mark(self, key: str) -> None:
        await self.mark_all([key])

    async def seen_all(self, keys: Sequence[str]) -> list[bool]:
        self.questions.append(list(keys))
        return [key in self.marked for key in keys]

    async def mark_all(self, keys: Sequence[str]) -> None:
        self.marks.append(list(keys))
        self.marked.update(keys)


class _DeadLetters:
    """A producer that publishes nothing but DLQ records, acknowledged at once."""

    def __init__(self) -> None:
        self.dead: list[WireMessage] = []

    async def send_all(self, outputs: Sequence[Outbound]) -> None:
        assert not outputs

    async def send_wire(self, topic: str, message: WireMessage) -> asyncio.Future[object]:
        assert topic == "dlq"
        self.dead.append(message)
        acked: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        acked.set_result(None)
        return acked


def _key_of(record: ConsumerRecord[bytes, bytes]) -> str:
    return decode(key=record.key, value=record.value, headers=record.headers).dedupe_key


FETCH = {"p0": [_record(0, 0), _record(0, 1)], "p1": [_record(1, 0)]}
NO_ASSIGNMENT: Any = type("FakeConsumer", (), {"assignment": lambda self: set()})()


async def _now(value: bool) -> bool:
    return value


async def test_a_per_record_handler_gets_each_record_of_a_fetch_on_its_own() -> None:
    calls: list[str] = []

    async def handler(event: Inbound) -> Sequence[Outbound]:
        calls.append(event.envelope.invocationid or "")
        return []

    runtime = _consumer(handler)
    runtime._dispatch_batch(NO_ASSIGNMENT, FETCH)  # type: ignore[arg-type]
    await eventually(lambda: _now(len(calls) == 3))
    assert sorted(calls) == ["0-0", "0-1", "1-0"]
    await eventually(lambda: _now(not runtime._core.tasks))
    assert runtime._core.tracker.committable() == {Partition("t", 0): 2, Partition("t", 1): 1}


async def test_a_batch_handler_gets_the_whole_fetch_in_one_call() -> None:
    calls: list[list[str]] = []

    async def handle(events: Sequence[Inbound]) -> Sequence[Outbound]:
        calls.append([e.envelope.invocationid or "" for e in events])
        return []

    runtime = _consumer(ByBatch(handle))
    runtime._dispatch_batch(NO_ASSIGNMENT, FETCH)  # type: ignore[arg-type]
    await eventually(lambda: _now(not runtime._core.tasks))
    assert calls == [["0-0", "0-1", "1-0"]]
    assert runtime._core.tracker.committable() == {Partition("t", 0): 2, Partition("t", 1): 1}


async def test_a_batch_handler_cannot_schedule() -> None:
    async def handle(events: Sequence[Inbound]) -> Sequence[Outbound]:
        return []

    with pytest.raises(ValueError, match="one by one"):
        _consumer(ByBatch(handle), schedule=lambda env: Placement(0, ""))


class _CommitLog:
    """A consumer owning partitions 0 and 1 of ``t`` that records what it is asked."""

    def __init__(self) -> None:
        self.looked = 0
        self.commits: list[dict[tuple[str, int], int]] = []

    def assignment(self) -> set[TopicPartition]:
        self.looked += 1
        return {TopicPartition("t", 0), TopicPartition("t", 1)}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append({(tp.topic, tp.partition): off for tp, off in offsets.items()})


async def test_an_idle_committer_sleeps_until_a_record_finishes_then_commits_it() -> None:
    async def handler(event: Inbound) -> Sequence[Outbound]:
        return []

    runtime = _consumer(handler, commit_interval_s=0.01)
    kafka = _CommitLog()
    runtime._consumer = kafka  # type: ignore[assignment]
    committer = asyncio.create_task(runtime._commit_loop())
    try:
        await asyncio.sleep(0.1)  # ten commit intervals without a record
        assert (kafka.looked, kafka.commits) == (0, [])
        runtime._dispatch_batch(NO_ASSIGNMENT, FETCH)  # type: ignore[arg-type]
        await eventually(lambda: _now(len(kafka.commits) >= 1))
        assert kafka.commits[-1] == {("t", 0): 2, ("t", 1): 1}
        await asyncio.sleep(0.1)
        assert len(kafka.commits) == 1  # nothing new finished: no further commit
    finally:
        committer.cancel()


async def test_with_markers_each_partition_of_a_fetch_is_asked_and_marked_in_one_call() -> None:
    handled: list[str] = []

    async def handler(event: Inbound) -> Sequence[Outbound]:
        handled.append(event.envelope.invocationid or "")
        return []

    done_before = _key_of(FETCH["p0"][1])
    markers = _Markers(done_before)
    runtime = _consumer(handler, processed=markers)
    runtime._dispatch_batch(NO_ASSIGNMENT, FETCH)  # type: ignore[arg-type]
    await eventually(lambda: _now(not runtime._core.tasks))

    assert sorted(handled) == ["0-0", "1-0"]  # 0-1 was processed before: skipped
    p0, p1 = [_key_of(r) for r in FETCH["p0"]], [_key_of(r) for r in FETCH["p1"]]
    assert sorted(markers.questions) == sorted([p0, p1])
    assert sorted(markers.marks) == sorted([[p0[0]], p1])
    assert runtime._core.tracker.committable() == {Partition("t", 0): 2, Partition("t", 1): 1}
    assert not runtime._core.in_flight_keys
    assert runtime._core.in_flight == 0


async def test_with_markers_a_record_that_cannot_be_handled_is_dead_lettered_alone() -> None:
    async def handler(event: Inbound) -> Sequence[Outbound]:
        if event.envelope.invocationid == "0-0":
            raise ValueError("a bug in the handler")
        return []

    markers = _Markers()
    dlq = _DeadLetters()
    runtime = _consumer(handler, processed=markers, producer=dlq)
    runtime._dispatch_batch(NO_ASSIGNMENT, FETCH)  # type: ignore[arg-type]
    await eventually(lambda: _now(not runtime._core.tasks))

    dead = [decode(key=m.key, value=m.value, headers=m.headers).data for m in dlq.dead]
    assert [(d["partition"], d["offset"], d["error"]["code"]) for d in dead] == [
        (0, 0, "internal_error")
    ]
    assert markers.marked == {_key_of(r) for r in (FETCH["p0"][1], FETCH["p1"][0])}
    # Dead-lettered is finished too: both partitions commit past every record.
    assert runtime._core.tracker.committable() == {Partition("t", 0): 2, Partition("t", 1): 1}


async def test_with_markers_a_revoked_partition_stops_its_handlers_and_marks_nothing() -> None:
    started = asyncio.Event()
    cancelled: list[str] = []

    async def handler(event: Inbound) -> Sequence[Outbound]:
        if event.partition == 0:
            started.set()
            try:
                await asyncio.Event().wait()  # a handler that does not end by itself
            except asyncio.CancelledError:
                cancelled.append(event.envelope.invocationid or "")
                raise
        return []

    markers = _Markers()
    runtime = _consumer(handler, processed=markers, revoke_grace_s=0.05)
    runtime._dispatch_batch(NO_ASSIGNMENT, FETCH)  # type: ignore[arg-type]
    await started.wait()
    await eventually(lambda: _now(Partition("t", 1) in runtime._core.tracker.committable()))

    await runtime.release([Partition("t", 0)])

    assert sorted(cancelled) == ["0-0", "0-1"]  # over before the revoke returned
    assert not runtime._core.tasks
    assert markers.marks == [[_key_of(FETCH["p1"][0])]]  # nothing of the revoked partition
    assert not runtime._core.in_flight_keys
    assert runtime._core.in_flight == 0


async def test_with_markers_an_event_replayed_within_one_fetch_is_handled_once() -> None:
    """A producer with topic access writes the same event twice in a row: both land in
    one fetch of one partition, the copy is a duplicate, and both offsets finish."""
    handled: list[str] = []

    async def handler(event: Inbound) -> Sequence[Outbound]:
        handled.append(event.envelope.invocationid or "")
        return []

    original = _record(0, 0)
    replayed = dataclasses.replace(original, offset=1)
    markers = _Markers()
    runtime = _consumer(handler, processed=markers)
    runtime._dispatch_batch(NO_ASSIGNMENT, {"p0": [original, replayed]})  # type: ignore[arg-type]
    await eventually(lambda: _now(not runtime._core.tasks))

    assert handled == ["0-0"]
    assert markers.marks == [[_key_of(original)]]
    assert runtime._core.tracker.committable() == {Partition("t", 0): 2}


class _Polled:
    """A consumer of partition 0 of ``t`` whose fetches hand over ``records`` one at a
    time (as ``max_records`` asks) and record what the poll loop does to it."""

    def __init__(self, records: list[ConsumerRecord[bytes, bytes]]) -> None:
        self.records = records
        self.calls: list[str] = []
        self.paused = False

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("t", 0)}

    def pause(self, *partitions: TopicPartition) -> None:
        self.calls.append("pause")
        self.paused = True

    def resume(self, *partitions: TopicPartition) -> None:
        self.calls.append("resume")
        self.paused = False

    async def getmany(
        self, *, timeout_ms: int, max_records: int
    ) -> dict[TopicPartition, list[ConsumerRecord[bytes, bytes]]]:
        self.calls.append("getmany")
        if self.paused or not self.records:
            await asyncio.sleep(timeout_ms / 1000)
            return {}
        taken, self.records = self.records[:max_records], self.records[max_records:]
        return {TopicPartition("t", 0): taken}


class _Held:
    """A handler that holds each record until released, and the calls it started."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started: list[str] = []

    async def __call__(self, event: Inbound) -> Sequence[Outbound]:
        self.started.append(event.envelope.invocationid or "")
        await self.release.wait()
        return []


@contextlib.asynccontextmanager
async def _one_slot(*, full_poll_s: float | None = None) -> AsyncIterator[tuple[_Held, _Polled]]:
    """The poll loop of a consumer with one slot, over two records of partition 0."""
    held = _Held()
    runtime = _consumer(held, max_in_flight=1)
    if full_poll_s is not None:
        runtime.full_poll_s = full_poll_s
    kafka = _Polled([_record(0, 0), _record(0, 1)])
    stop = asyncio.Event()
    pacing = LongPolls(broker_wait_ms=500, poll_timeout_ms=10)
    loop = asyncio.create_task(runtime._poll_loop(kafka, stop, pacing))  # type: ignore[arg-type]
    try:
        yield held, kafka
    finally:
        stop.set()
        held.release.set()
        await loop


async def test_a_consumer_at_its_bound_waits_for_room_without_pausing_or_polling() -> None:
    """A paused partition's records that aiokafka fetched already are dropped at the next
    ``getmany`` and fetched again on resume: a consumer at its in-flight bound must leave
    its partitions alone and wait for a record to finish, then take the next at once."""
    async with _one_slot() as (held, kafka):
        await eventually(lambda: _now(held.started == ["0-0"]))
        for _ in range(50):  # the loop gets every chance to go round while it is full
            await asyncio.sleep(0)
        assert kafka.calls == ["getmany"]  # no pause, no poll while the one slot is taken
        held.release.set()
        await eventually(lambda: _now(held.started == ["0-0", "0-1"]))
        assert "pause" not in kafka.calls


async def test_a_consumer_full_for_long_pauses_and_polls_to_stay_in_its_group() -> None:
    """Long tools holding every slot past ``full_poll_s``: the loop pauses its partitions
    and polls (aiokafka leaves the group of a member that calls no ``getmany`` for
    ``max.poll.interval.ms``), and resumes them once a slot is free."""
    async with _one_slot(full_poll_s=0.01) as (held, kafka):
        await eventually(lambda: _now(kafka.calls[:3] == ["getmany", "pause", "getmany"]))
        assert held.started == ["0-0"]  # the poll while paused brought nothing
        held.release.set()
        await eventually(lambda: _now(held.started == ["0-0", "0-1"]))
        assert kafka.calls.count("resume") == 1
