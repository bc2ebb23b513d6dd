"""Which queued record a consumer starts next: by priority, fair across tenants.

A :class:`Backlog` holds records that were fetched but not started. :meth:`Backlog.pop`
picks the next one to start:

- strictly by rank (lower first: the executor maps ``high``, ``normal``, ``low`` to
  0, 1, 2), so a queued ``high`` call starts before every queued ``normal`` one;
- within a rank, round-robin over the tenants that have queued work, FIFO within a
  tenant, so one tenant's thousand queued calls delay another tenant's single call by
  at most one call each;
- never for a tenant that already runs ``max_running_per_tenant`` records: that tenant
  is skipped (parked) until one of its records finishes, and the others go ahead.

Every operation but :meth:`Backlog.drop` is O(number of ranks), amortized: a tenant at
its bound is parked the first time :meth:`~Backlog.pop` meets it and put back in line by
:meth:`~Backlog.done`, so nothing scans the backlog. Pure logic, no I/O.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, NamedTuple, TypeVar

T = TypeVar("T")


class Placement(NamedTuple):
    """Where a record goes in the backlog."""

    rank: int
    """Priority class; lower ranks start first."""
    tenant: str
    """Fairness and bound key: the record's tenant."""


class _RankQueue(Generic[T]):
    """One priority class: a FIFO per tenant and the round-robin line of tenants."""

    __slots__ = ("line", "parked", "queues")

    def __init__(self) -> None:
        self.queues: dict[str, deque[T]] = {}
        """Queued items per tenant; a tenant with nothing queued has no entry."""
        self.line: deque[str] = deque()
        """Tenants with queued items that may start, in round-robin order."""
        self.parked: set[str] = set()
        """Tenants with queued items that are at their running bound."""


class Backlog(Generic[T]):
    """Queued items, picked by rank, then round-robin over tenants, FIFO per tenant."""

    def __init__(self, *, max_running_per_tenant: int | None = None) -> None:
        if max_running_per_tenant is not None and max_running_per_tenant < 1:
            raise ValueError("max_running_per_tenant must be at least 1")
        self._bound = max_running_per_tenant
        self._ranks: list[int] = []  # sorted; few (three for the executor)
        self._by_rank: dict[int, _RankQueue[T]] = {}
        self._running: dict[str, int] = {}
        self._size = 0

    def __len__(self) -> int:
        """Items queued (not started)."""
        return self._size

    def running(self, tenant: str) -> int:
        """Items of ``tenant`` started and not yet :meth:`done`."""
        return self._running.get(tenant, 0)

    def push(self, item: T, placement: Placement) -> None:
        """Queue ``item`` behind its tenant's earlier items of the same rank."""
        rank, tenant = placement
        queue = self._by_rank.get(rank)
        if queue is None:
            queue = self._by_rank[rank] = _RankQueue()
            bisect.insort(self._ranks, rank)
        items = queue.queues.get(tenant)
        if items is None:
            queue.queues[tenant] = deque((item,))
            if self._at_bound(tenant):
                queue.parked.add(tenant)
            else:
                queue.line.append(tenant)
        else:
            items.append(item)
        self._size += 1

    def pop(self) -> tuple[T, str] | None:
        """The next item to start and its tenant (now counted running), or None.

        None means nothing queued may start: the backlog is empty or every tenant with
        queued items is at its bound.
        """
        for rank in self._ranks:
            queue = self._by_rank[rank]
            line = queue.line
            while line:
                tenant = line.popleft()
                if self._at_bound(tenant):  # reached its bound in another rank
                    queue.parked.add(tenant)
                    continue
                items = queue.queues[tenant]
                item = items.popleft()
                self._size -= 1
                self._running[tenant] = self._running.get(tenant, 0) + 1
                if not items:
                    del queue.queues[tenant]
                elif self._at_bound(tenant):
                    queue.parked.add(tenant)
                else:
                    line.append(tenant)  # back of the line: the others go first
                return item, tenant
        return None

    def done(self, tenant: str) -> None:
        """An item of ``tenant`` that :meth:`pop` returned has finished."""
        count = self._running.get(tenant, 0) - 1
        if count > 0:
            self._running[tenant] = count
        else:
            self._running.pop(tenant, None)
        if not self._at_bound(tenant):
            for rank in self._ranks:
                queue = self._by_rank[rank]
                if tenant in queue.parked:
                    queue.parked.discard(tenant)
                    queue.line.append(tenant)

    def drop(self, predicate: Callable[[T], bool]) -> list[T]:
        """Remove and return the queued items ``predicate`` selects (O(queued)).

        For rebalances: the queued records of revoked partitions are dropped, and their
        next owner reads them again.
        """
        dropped: list[T] = []
        for queue in self._by_rank.values():
            for tenant in list(queue.queues):
                items = queue.queues[tenant]
                kept = deque(item for item in items if not predicate(item))
                if len(kept) == len(items):
                    continue
                dropped.extend(item for item in items if predicate(item))
                if kept:
                    queue.queues[tenant] = kept
                else:
                    del queue.queues[tenant]
                    queue.parked.discard(tenant)
            if len(queue.line) != len(queue.queues) - len(queue.parked):
                queue.line = deque(t for t in queue.line if t in queue.queues)
        self._size -= len(dropped)
        return dropped

    def __iter__(self) -> Iterator[T]:
        """Queued items, in no particular order."""
        for queue in self._by_rank.values():
            for items in queue.queues.values():
                yield from items

    def _at_bound(self, tenant: str) -> bool:
        return self._bound is not None and self._running.get(tenant, 0) >= self._bound
