"""Executor pools on the executor's side: calls that reached an executor lacking their
tool, and calls that waited past their deadline. Over ports, no client imports.

**A call whose tool this executor lacks** (a misconfigured pool: its topic carries a
tool the executor did not load) is not failed with ``tool_not_found`` while another
executor of the pool has the tool. :meth:`PoolRouter.misrouted` hands it to one: the
same authorized event (policy's grant unchanged, a new event id) on a partition of the
pool's topic that a live executor with the tool holds, as the executors announce them
(:mod:`toolfleet.storage.pools`). When no live executor of the pool has the tool, the
call is *parked* in Redis and announced ``queued`` (``ai.agent.tool.invoke.queued``,
``reason=tool_not_loaded``, naming this executor): :meth:`QueueSweeper.sweep` hands it
over as soon as one is live. Either way it is logged: which executor lacked which tool.

**A call that waited past its deadline** (its authorization time plus its timeout)
while its pool still has no live executor that can run it ends ``timeout``, once; a
queued call cancelled meanwhile ends ``cancelled`` at the next sweep (every executor
sees every cancel and makes the call due at once). The sweeper takes the call's
execution lease like an executor would and claims the outcome under it
(:class:`~toolfleet.executor.leasing.leases.Leases`), so an executor that reads the call
later replays that outcome instead of running it, and one running it already keeps it
(its run's own timeout applies). A call whose pool has a live executor by its deadline
is left to it, as any call on a pool's topic is (it runs, or is refused once its grant
has expired): restarting a pool's only executor never times its calls out.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

from redis.exceptions import RedisError

from toolfleet.errors import Cancelled, ToolTimeout
from toolfleet.events.envelope import Emitted, Envelope, derived_event_id
from toolfleet.events.identity import CallRef
from toolfleet.events.models import ExecutionMetadata, InvokeAuthorized
from toolfleet.events.outcomes import failure_event
from toolfleet.events.types import Source, TopicName
from toolfleet.executor.leasing.leases import (
    Finished,
    FinishedRecord,
    Leases,
    OutgoingEvent,
    Taken,
)
from toolfleet.storage.cancel_flags import CancelFlags
from toolfleet.storage.pools import (
    ExecutorPresence,
    PoolPresence,
    QueuedCall,
    QueuedCalls,
    queued_call,
    queued_notification,
)

__all__ = [
    "Destination",
    "PartitionSender",
    "PoolRouter",
    "QueueSweeper",
    "choose_target",
    "deadline_outcome",
    "handed_over",
]

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0
"""How often an executor looks for calls past their deadline and parked calls to hand over."""
SWEEP_BATCH = 100
"""Calls one sweep takes of each kind."""
CLAIM_LEASE_S = 30.0
"""A call a sweeper claimed is hidden from the others this long (it is dropped sooner)."""


class PartitionSender(Protocol):
    """Publishes one event on one partition of a topic, acknowledged when it returns."""

    async def send(self, topic: str, partition: int, envelope: Envelope) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class Destination:
    """Where a call goes: an executor of its pool with its tool, one of its partitions."""

    worker_id: str
    partition: int


def choose_target(
    executors: Sequence[ExecutorPresence],
    *,
    pool: str,
    tool_id: str,
    tool_version: str,
    invocation_id: str,
    exclude: str | None = None,
) -> Destination | None:
    """A live executor serving ``pool`` that has the tool loaded and holds partitions of
    the pool's topic (None: there is none). The same call picks the same one while the
    candidates stay the same, so two executors handing it over agree."""
    candidates = sorted(
        (e for e in executors if e.worker_id != exclude and pool in e.pools),
        key=lambda e: e.worker_id,
    )
    usable = [
        (e, parts)
        for e in candidates
        if e.has(tool_id, tool_version) and (parts := sorted(e.partitions.get(pool, ())))
    ]
    if not usable:
        return None
    digest = int.from_bytes(hashlib.sha256(invocation_id.encode()).digest()[:8], "big")
    executor, partitions = usable[digest % len(usable)]
    return Destination(worker_id=executor.worker_id, partition=partitions[digest % len(partitions)])


def handed_over(event: Envelope) -> Envelope:
    """The authorized event as an executor hands it on: the same call, grant and trace,
    a new id (the first one was consumed by the pool's group) from the executor."""
    return event.model_copy(update={"id": str(uuid.uuid4()), "source": Source.EXECUTOR.value})


@dataclass(kw_only=True)
class PoolRouter:
    """Hands a call whose tool this executor lacks to one of its pool that has it."""

    worker_id: str
    presence: PoolPresence
    queued: QueuedCalls
    sender: PartitionSender
    topic_of: Callable[[str], str]
    """The topic of a pool (:func:`toolfleet.events.types.pool_topic` with the prefix)."""

    async def misrouted(self, event: Envelope, call: InvokeAuthorized, pool: str) -> list[Emitted]:
        """Hand the call over, or park it (``queued``) when no live executor of ``pool``
        has its tool. Nothing is emitted for a hand-over: the executor that has the tool
        reports what it does.

        Raises:
            RedisError: the executors' presence or the queue is unreachable (retried).
        """
        tool = f"{call.tool_id}@{call.tool_version}"
        target = choose_target(
            await self.presence.live(),
            pool=pool,
            tool_id=call.tool_id,
            tool_version=call.tool_version,
            invocation_id=str(call.invocation_id),
            exclude=self.worker_id,
        )
        if target is not None:
            await self.sender.send(self.topic_of(pool), target.partition, handed_over(event))
            log.warning(
                "executor lacks the tool; call handed to one of its pool that has it",
                extra={
                    "worker_id": self.worker_id,
                    "tool": tool,
                    "pool": pool,
                    "invocation_id": str(call.invocation_id),
                    "handed_to": target.worker_id,
                    "partition": target.partition,
                },
            )
            return []
        parked = queued_call(
            event, call, pool=pool, reason="tool_not_loaded", parked_by=self.worker_id
        )
        await self.queued.add(parked)
        log.warning(
            "executor lacks the tool and no live executor of its pool has it; call queued",
            extra={
                "worker_id": self.worker_id,
                "tool": tool,
                "pool": pool,
                "invocation_id": str(call.invocation_id),
            },
        )
        return [queued_notification(parked, source=Source.EXECUTOR)]


Publish = Callable[[list[Emitted]], Awaitable[None]]


@dataclass(kw_only=True)
class QueueSweeper:
    """Ends queued calls at their deadline, and hands parked calls to an executor with
    their tool once one is live. Every executor runs one; they share the work."""

    worker_id: str
    queued: QueuedCalls
    leases: Leases
    presence: PoolPresence
    sender: PartitionSender
    topic_of: Callable[[str], str]
    publish: Publish
    """Publishes outcomes (acknowledged when it returns)."""
    pools: frozenset[str] = frozenset()
    """The pools this executor serves: live, whether or not its presence is announced yet."""
    cancels: CancelFlags | None = None
    """Read when the lease's script did not read the cancel flag (leases without it)."""
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))

    async def run(self, stop: asyncio.Event, *, interval_s: float = SWEEP_INTERVAL_S) -> None:
        """Sweep every ``interval_s`` until ``stop``; a failed sweep is logged and retried."""
        while not stop.is_set():
            try:
                await self.sweep()
            except (RedisError, OSError) as exc:
                log.warning("queued calls not swept: %s", type(exc).__name__)
            except Exception:
                log.exception("queued calls not swept")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)

    async def sweep(self) -> None:
        """One pass over the calls past their deadline, then the parked ones."""
        due = await self.queued.claim_due(self.clock(), limit=SWEEP_BATCH, lease_s=CLAIM_LEASE_S)
        parked = await self.queued.parked(limit=SWEEP_BATCH)
        if not due and not parked:
            return
        executors = await self.presence.live()
        for queued in due:
            await self.settle(queued, executors)
        for queued in parked:
            if queued.call not in {q.call for q in due}:
                await self.hand_over(queued, executors)

    async def settle(self, queued: QueuedCall, executors: Sequence[ExecutorPresence]) -> None:
        """A call past its deadline ends ``timeout`` while its pool still has no executor
        that can run it; otherwise it goes (or stays) with one, whose own checks apply."""
        finished = await self.leases.finished(queued.call)
        if finished is not None:
            await self._published(queued, finished)
            await self.queued.drop(queued.call)
        elif queued.parked:
            if not await self.hand_over(queued, executors):
                await self.end(queued)
        elif self._served(queued.pool, executors):
            # On the pool's topic, which a live executor reads: it runs it (or refuses it).
            await self.queued.drop(queued.call)
        else:
            await self.end(queued)

    def _served(self, pool: str, executors: Sequence[ExecutorPresence]) -> bool:
        return pool in self.pools or any(pool in e.pools for e in executors)

    async def end(self, queued: QueuedCall) -> None:
        """End a call past its deadline, unless it started or ended meanwhile."""
        call = queued.call
        state = await self.leases.acquire(call, f"{self.worker_id}/queue-sweeper")
        if isinstance(state, Taken):
            fence = state.fence
            if fence.run > 1:  # it ran before: being handed over, not waiting
                await self.leases.release(fence)
                await self.queued.drop(call)
                return
            if state.seen is not None:
                cancelled = state.seen.cancel_requested
            else:
                cancelled = self.cancels is not None and await self.cancels.is_requested(call)
            outcome = deadline_outcome(queued, cancelled=cancelled)
            if await self.leases.finish(
                fence, [OutgoingEvent(topic=TopicName.RESULTS, envelope=outcome)]
            ):
                await self.publish([(TopicName.RESULTS, outcome)])
                log.info(
                    "queued call reached its deadline with no executor of its pool",
                    extra={"invocation_id": queued.invocation_id, "pool": queued.pool},
                )
        elif isinstance(state, Finished):
            await self._published(queued, state.record)
        # Held: an executor runs it now, under its own timeout.
        await self.queued.drop(call)

    async def _published(self, queued: QueuedCall, record: FinishedRecord) -> None:
        """Publish again a deadline outcome this sweeper claimed but may not have sent
        (it died in between); an executor's outcome is its own to publish."""
        ours = deadline_outcome_id(queued)
        mine = [(e.topic, e.envelope) for e in record.events if e.envelope.id == ours]
        if mine:
            await self.publish(mine)

    async def hand_over(self, queued: QueuedCall, executors: Sequence[ExecutorPresence]) -> bool:
        """Send a parked call to a live executor of its pool with its tool; False when
        there is none (or another sweeper took it first)."""
        target = choose_target(
            executors,
            pool=queued.pool,
            tool_id=queued.tool_id,
            tool_version=queued.tool_version,
            invocation_id=queued.invocation_id,
        )
        if target is None or not await self.queued.unpark(queued.call):
            return False
        try:
            event = handed_over(queued.event)
            await self.sender.send(self.topic_of(queued.pool), target.partition, event)
        except BaseException:
            await self.queued.add(queued)  # parked again: the next sweep retries
            raise
        await self.queued.drop(queued.call)  # with an executor that has the tool now
        log.info(
            "parked call handed to an executor of its pool that has the tool",
            extra={
                "invocation_id": queued.invocation_id,
                "pool": queued.pool,
                "handed_to": target.worker_id,
            },
        )
        return True


def _deadline_parent(queued: QueuedCall) -> Envelope:
    """The authorized event under an id of the sweeper's own: the outcome's id, derived
    from it, is then never an executor's answer to the same event."""
    return queued.event.model_copy(update={"id": derived_event_id(queued.event, "queue-deadline")})


def deadline_outcome_id(queued: QueuedCall) -> str:
    """The id of :func:`deadline_outcome` (what the sweeper looks for in a finished record)."""
    return derived_event_id(_deadline_parent(queued), "terminal")


def deadline_outcome(queued: QueuedCall, *, cancelled: bool) -> Envelope:
    """The outcome of a call that no executor started before its deadline."""
    call = queued.event.data_as(InvokeAuthorized)
    parent = _deadline_parent(queued)
    error = (
        Cancelled("cancelled before it ran")
        if cancelled
        else ToolTimeout(
            f"no executor of pool {queued.pool!r} started the call before its deadline",
            details={"pool": queued.pool},
        )
    )
    return failure_event(
        parent,
        Source.EXECUTOR,
        error,
        call=CallRef.of(call, trace=queued.event.traceparent),
        warnings=call.warnings,
        execution_metadata=ExecutionMetadata(attempts=0),
    )
