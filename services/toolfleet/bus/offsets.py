"""Which offset of each partition is safe to commit while many records run at once.

A partition is committed only up to its lowest unfinished offset: a record that
finished early never lets the commit pass one that is still running, so a crash
redelivers everything unfinished (at-least-once) and nothing else.

Memory follows the records in flight, not the records seen: the min-heap over a
partition's unfinished offsets drops finished entries lazily from its top, and is rebuilt
from the unfinished set whenever stale entries outnumber live ones (one long-running
record at the bottom used to keep every later, finished offset in the heap).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import NamedTuple


class Partition(NamedTuple):
    topic: str
    partition: int


_SLACK = 64
"""Stale heap entries a partition may hold beyond its unfinished count before a rebuild
(amortised: a rebuild of k live entries follows at least k + 64 finishes)."""


class _PartitionState:
    __slots__ = ("committed", "heap", "next_offset", "unfinished")

    def __init__(self) -> None:
        self.unfinished: set[int] = set()
        self.heap: list[int] = []  # lazy min-heap over `unfinished`
        self.next_offset: int | None = None  # one past the highest offset seen
        self.committed: int | None = None

    def finish(self, offset: int) -> None:
        self.unfinished.discard(offset)
        if len(self.heap) > 2 * len(self.unfinished) + _SLACK:
            self.heap = sorted(self.unfinished)  # a sorted list is a valid min-heap

    def low_watermark(self) -> int | None:
        while self.heap and self.heap[0] not in self.unfinished:
            heapq.heappop(self.heap)
        return self.heap[0] if self.heap else self.next_offset


class OffsetTracker:
    """Tracks started and finished offsets per partition (pure logic, no I/O).

    ``on_finish`` is called after each finish: how a committer learns there may be
    something to commit without waking up to look (an idle consumer's commit loop
    sleeps until then).
    """

    def __init__(self, on_finish: Callable[[], None] | None = None) -> None:
        self._parts: dict[Partition, _PartitionState] = {}
        self._on_finish = on_finish

    def started(self, part: Partition, offset: int) -> None:
        state = self._parts.setdefault(part, _PartitionState())
        state.unfinished.add(offset)
        heapq.heappush(state.heap, offset)
        if state.next_offset is None or offset + 1 > state.next_offset:
            state.next_offset = offset + 1

    def finished(self, part: Partition, offset: int) -> None:
        state = self._parts.get(part)
        if state is not None:
            state.finish(offset)
        if self._on_finish is not None:
            self._on_finish()

    def held(self, part: Partition) -> int:
        """Offsets the tracker holds for ``part`` (live and stale): what its memory follows."""
        state = self._parts.get(part)
        return len(state.heap) + len(state.unfinished) if state else 0

    def unfinished(self, part: Partition) -> int:
        state = self._parts.get(part)
        return len(state.unfinished) if state else 0

    def committable(self, parts: Iterable[Partition] | None = None) -> dict[Partition, int]:
        """Offsets to commit now: per partition, its lowest unfinished offset (or next)."""
        result: dict[Partition, int] = {}
        for part in self._parts if parts is None else parts:
            state = self._parts.get(part)
            if state is None:
                continue
            low = state.low_watermark()
            if low is not None and (state.committed is None or low > state.committed):
                result[part] = low
        return result

    def mark_committed(self, offsets: dict[Partition, int]) -> None:
        for part, offset in offsets.items():
            state = self._parts.get(part)
            if state is not None:
                state.committed = offset

    def forget(self, parts: Iterable[Partition]) -> None:
        """Drop partitions this consumer no longer owns."""
        for part in parts:
            self._parts.pop(part, None)
