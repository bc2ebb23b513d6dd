"""Commit only up to the lowest unfinished offset, whatever order records finish in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet.bus.offsets import OffsetTracker, Partition

pytestmark = pytest.mark.unit

P0 = Partition("t", 0)
P1 = Partition("t", 1)

# One step: start the next record of a partition (offsets may skip, as after compaction
# or transaction markers), finish one of its unfinished records, or commit.
steps = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.sampled_from([P0, P1]), st.integers(1, 3)),
        st.tuples(st.just("finish"), st.sampled_from([P0, P1]), st.integers(0, 50)),
        st.tuples(st.just("commit"), st.just(P0), st.just(0)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(steps=steps, first=st.integers(0, 1_000))
def test_committable_is_the_lowest_unfinished_offset(
    steps: list[tuple[str, Partition, int]], first: int
) -> None:
    tracker = OffsetTracker()
    unfinished: dict[Partition, set[int]] = {P0: set(), P1: set()}
    next_offset: dict[Partition, int] = {P0: first, P1: first}
    started_any: dict[Partition, bool] = {P0: False, P1: False}
    committed: dict[Partition, int] = {}
    for action, part, n in steps:
        if action == "start":
            offset = next_offset[part] + n - 1
            tracker.started(part, offset)
            unfinished[part].add(offset)
            next_offset[part] = offset + 1
            started_any[part] = True
        elif action == "finish" and unfinished[part]:
            offset = sorted(unfinished[part])[n % len(unfinished[part])]
            tracker.finished(part, offset)
            unfinished[part].discard(offset)
        else:
            offsets = tracker.committable()
            for p, offset in offsets.items():
                assert started_any[p]
                expected = min(unfinished[p]) if unfinished[p] else next_offset[p]
                assert offset == expected
                assert all(offset <= u for u in unfinished[p])  # never passes unfinished
                assert offset > committed.get(p, -1)  # monotonic, and only when it moved
            tracker.mark_committed(offsets)
            committed.update(offsets)
        for p in (P0, P1):
            assert tracker.unfinished(p) == len(unfinished[p])


def test_out_of_order_finish_holds_the_commit_back() -> None:
    tracker = OffsetTracker()
    for offset in (10, 11, 12):
        tracker.started(P0, offset)
    tracker.finished(P0, 12)
    tracker.finished(P0, 11)
    assert tracker.committable() == {P0: 10}
    tracker.finished(P0, 10)
    assert tracker.committable() == {P0: 13}


def test_committed_offsets_are_not_reported_again() -> None:
    tracker = OffsetTracker()
    tracker.started(P0, 0)
    tracker.finished(P0, 0)
    offsets = tracker.committable()
    assert offsets == {P0: 1}
    tracker.mark_committed(offsets)
    assert tracker.committable() == {}


def test_redelivered_lower_offset_never_moves_the_commit_back() -> None:
    tracker = OffsetTracker()
    tracker.started(P0, 5)
    tracker.finished(P0, 5)
    tracker.mark_committed(tracker.committable())
    tracker.started(P0, 3)  # redelivered after a seek
    assert tracker.committable() == {}


def test_selected_and_forgotten_partitions() -> None:
    tracker = OffsetTracker()
    tracker.started(P0, 0)
    tracker.started(P1, 7)
    assert tracker.committable([P1]) == {P1: 7}
    assert tracker.committable([Partition("other", 0)]) == {}
    tracker.forget([P0])
    assert tracker.committable() == {P1: 7}
    assert tracker.unfinished(P0) == 0
    tracker.finished(P0, 0)  # a late finish of a revoked partition is ignored
    assert tracker.committable() == {P1: 7}


def test_one_long_record_does_not_make_memory_follow_throughput() -> None:
    """A long-running tool at offset 0 and 500k short records after it: the commit waits
    at 0, and the tracker holds about the records in flight, not the 500k it saw."""
    tracker = OffsetTracker()
    tracker.started(P0, 0)
    most_held = 0
    for offset in range(1, 500_001):
        tracker.started(P0, offset)
        tracker.finished(P0, offset)
        most_held = max(most_held, tracker.held(P0))
    assert tracker.committable() == {P0: 0}
    assert tracker.unfinished(P0) == 1
    assert most_held < 200  # two live offsets at most, plus bounded slack
    tracker.finished(P0, 0)
    assert tracker.committable() == {P0: 500_001}


def test_memory_follows_in_flight_records_finishing_in_any_order() -> None:
    tracker = OffsetTracker()
    in_flight: list[int] = []
    for offset in range(100_000):
        tracker.started(P0, offset)
        in_flight.append(offset)
        if len(in_flight) == 50:  # finish the newest first, the oldest last
            for done in reversed(in_flight):
                tracker.finished(P0, done)
            in_flight.clear()
        assert tracker.held(P0) <= 4 * 50 + 64  # heap: 2 x in flight + slack; the set: in flight
    assert tracker.committable() == {P0: 100_000}
