"""Runs one execution under its lease: take it (or wait for it), keep it, finish with it.

:meth:`LeaseGuard.hold` holds the executor's run of one ``invoke.authorized`` event
(the first context the run's ``AsyncExitStack`` enters, so the last it leaves):

1. take the lease; while a live worker holds it, wait (it may be a worker that died:
   its lease lapses, then this one takes over with the next epoch); a finished
   invocation's recorded events are returned as they are, nothing runs again;
2. heartbeat every third of the TTL while the work runs (one heartbeat renews every
   lease the guard holds, in one batch); the moment a renewal finds a newer epoch, the
   work is cancelled: this worker was presumed dead and replaced;
3. claim the outcome with ``finish`` under the same epoch before anything is published.

A lost lease surfaces as :class:`LeaseLost`, which the consumer runtime retries: the
retry finds the new owner's outcome (and replays it) or waits for its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from toolfleet.events.envelope import Emitted
from toolfleet.events.identity import CallKey
from toolfleet.executor.leasing.fencing import Fence, StaleLease
from toolfleet.executor.leasing.leases import (
    Finished,
    Held,
    Leases,
    OutgoingEvent,
    Seen,
    Taken,
)
from toolfleet.observability import metrics

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """This worker no longer owns the invocation; its work was discarded, not published.

    Transient for the consumer runtime: handling the event again replays the new
    owner's outcome once there is one.
    """


class Suspended(BaseException):
    """Raised from ``ctx.checkpoint()`` at shutdown, once the checkpoint is saved.

    A ``BaseException`` so a tool's ``except Exception`` does not swallow it: the tool
    stops at a point it can resume from, and the call is handed to the next owner.
    """


@dataclass(kw_only=True)
class Hold:
    """One run's hold on its invocation, as :meth:`LeaseGuard.hold` yields it."""

    fence: Fence | None = None
    """The epoch the run writes under (None when the call had finished: see ``replay``)."""
    replay: list[Emitted] | None = None
    """A finished invocation's recorded events: publish them again, run nothing."""
    outcome: list[Emitted] | None = None
    """Set by the run; claimed with ``finish`` under the same epoch when the hold ends."""
    seen: Seen | None = None
    """What the lease's script read of the invocation's keys (None: not read)."""


@dataclass(eq=False, slots=True)
class _Beat:
    """One held lease, renewed by the guard's heartbeat while its run goes on."""

    fence: Fence
    owner: str
    work: asyncio.Task[object]
    lost: bool = False
    """Set by the heartbeat when a renewal found a newer epoch (``work`` was cancelled)."""


@dataclass(kw_only=True)
class LeaseGuard:
    leases: Leases
    worker_id: str
    poll_max_s: float = 1.0
    """Longest pause between two tries at a lease another worker holds."""
    _beats: set[_Beat] = field(default_factory=set, init=False, repr=False)
    _heartbeat: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _nonce: str = field(default_factory=lambda: uuid.uuid4().hex[:8], init=False, repr=False)
    _holds: Iterator[int] = field(default_factory=itertools.count, init=False, repr=False)

    async def run(
        self,
        call: CallKey,
        work: Callable[[Fence], Awaitable[list[Emitted]]],
        *,
        stopping: Callable[[], bool],
    ) -> list[Emitted]:
        """``work`` under the lease (or the recorded events of a finished invocation)."""
        async with self.hold(call, stopping=stopping) as held:
            if held.replay is not None:
                return held.replay
            assert held.fence is not None
            held.outcome = await work(held.fence)
        return held.outcome

    @contextlib.asynccontextmanager
    async def hold(self, call: CallKey, *, stopping: Callable[[], bool]) -> AsyncIterator[Hold]:
        """Hold the lease while the body runs; claim ``Hold.outcome`` when it ends.

        Raises:
            LeaseLost: the heartbeat or the store found a newer epoch (the body, if still
                running, was cancelled); nothing of this run may be published.
        """
        # Unique per hold: a redelivery of a call this worker still runs waits for it.
        owner = f"{self.worker_id}/{self._nonce}{next(self._holds):x}"
        taken = await self._take(call, owner, stopping)
        if isinstance(taken, Finished):
            metrics.LEASE_EVENTS.labels("replayed").inc()
            yield Hold(replay=[(e.topic, e.envelope) for e in taken.record.events])
            return
        fence = taken.fence
        if fence.run > 1:
            metrics.LEASE_EVENTS.labels("taken_over").inc()
        task = asyncio.current_task()
        assert task is not None
        beat = _Beat(fence, owner, task)
        self._beat(beat)
        held = Hold(fence=fence, seen=taken.seen)
        try:
            yield held
        except asyncio.CancelledError:
            if not beat.lost:
                # Shutdown or revocation: hand the call over at once, not after the TTL.
                self._unbeat(beat)
                await _quietly(asyncio.shield(self.leases.release(fence)))
                raise
            task.uncancel()
            raise self._lost(fence, stopping()) from None
        except StaleLease:
            raise self._lost(fence, stopping()) from None
        finally:
            # From here on the heartbeat neither renews this lease nor cancels the run.
            self._unbeat(beat)
        if beat.lost:
            raise self._lost(fence, stopping())
        if held.outcome is None:  # nothing to claim: let the next delivery run it
            await _quietly(self.leases.release(fence))
            return
        outgoing = [OutgoingEvent(topic=topic, envelope=env) for topic, env in held.outcome]
        if not await self.leases.finish(fence, outgoing):
            raise self._lost(fence, stopping())

    def _lost(self, fence: Fence, stopping: bool) -> BaseException:
        """The error that discards this run: retried, or abandoned while shutting down."""
        metrics.LEASE_EVENTS.labels("lost").inc()
        log.warning(
            "lease lost: another worker owns the invocation now; this run is discarded",
            extra={"invocation_id": fence.invocation_id, "epoch": fence.epoch},
        )
        if stopping:  # leave the offset unfinished: the next owner of the partition reads it
            return asyncio.CancelledError()
        return LeaseLost(f"epoch {fence.epoch} of {fence.invocation_id} is stale")

    async def _take(
        self, call: CallKey, owner: str, stopping: Callable[[], bool]
    ) -> Taken | Finished:
        while True:
            state = await self.leases.acquire(call, owner)
            if not isinstance(state, Held):
                return state
            if stopping():  # not started here: leave it to the partition's next owner
                raise asyncio.CancelledError
            # Held by a live (or recently dead) worker: wait for its outcome or its TTL.
            await asyncio.sleep(min(max(state.expires_in_s, 0.05), self.poll_max_s))

    def _beat(self, beat: _Beat) -> None:
        """Renew ``beat``'s lease from now on (the heartbeat starts with the first lease)."""
        self._beats.add(beat)
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.create_task(self._heartbeats())

    def _unbeat(self, beat: _Beat) -> None:
        """Stop renewing ``beat``'s lease; the heartbeat stops with the last lease."""
        self._beats.discard(beat)
        if not self._beats and self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None

    async def _heartbeats(self) -> None:
        """One heartbeat for every lease this guard holds: every third of the TTL, each
        lease held then is renewed (in one batch), so no lease goes longer than that
        without a renewal. The moment a renewal finds a newer epoch, that run is
        cancelled: this worker was presumed dead and replaced."""
        interval = self.leases.ttl_s / 3
        while self._beats:
            await asyncio.sleep(interval)
            await asyncio.gather(*(self._renew(beat) for beat in list(self._beats)))

    async def _renew(self, beat: _Beat) -> None:
        try:
            renewed = await self.leases.renew(beat.fence, beat.owner)
        except Exception as exc:  # Redis away: keep trying; the fence decides later
            if beat in self._beats:
                log.warning("lease renewal failed: %s", type(exc).__name__)
            return
        if not renewed and beat in self._beats:
            beat.lost = True
            beat.work.cancel()


async def _quietly(step: Awaitable[object]) -> None:
    try:
        await step
    except Exception as exc:  # the TTL frees the lease anyway
        log.info("lease not released: %s", type(exc).__name__)
