"""Runs one execution under its lease: take it (or wait for it), keep it, finish with it.

:meth:`LeaseGuard.hold` holds the executor's run of one ``invoke.authorized`` event
(the first context the run's ``AsyncExitStack`` enters, so the last it leaves):

1. take the lease; while a live worker holds it, wait (it may be a worker that died:
   its lease lapses, then this one takes over with the next epoch); a finished
   invocation's recorded events are returned as they are, nothing runs again;
2. heartbeat every third of the TTL while the work runs; the moment a renewal finds a
   newer epoch, the work is cancelled: this worker was presumed dead and replaced;
3. claim the outcome with ``finish`` under the same epoch before anything is published.

A lost lease surfaces as :class:`LeaseLost`, which the consumer runtime retries: the
retry finds the new owner's outcome (and replays it) or waits for its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from toolfleet.events.envelope import Emitted
from toolfleet.executor.leasing.fencing import Fence, StaleLease
from toolfleet.executor.leasing.leases import Finished, Held, Leases, OutgoingEvent, Taken
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


@dataclass(kw_only=True)
class LeaseGuard:
    leases: Leases
    worker_id: str
    poll_max_s: float = 1.0
    """Longest pause between two tries at a lease another worker holds."""

    async def run(
        self,
        invocation_id: str,
        work: Callable[[Fence], Awaitable[list[Emitted]]],
        *,
        stopping: Callable[[], bool],
    ) -> list[Emitted]:
        """``work`` under the lease (or the recorded events of a finished invocation)."""
        async with self.hold(invocation_id, stopping=stopping) as held:
            if held.replay is not None:
                return held.replay
            assert held.fence is not None
            held.outcome = await work(held.fence)
        return held.outcome

    @contextlib.asynccontextmanager
    async def hold(
        self, invocation_id: str, *, stopping: Callable[[], bool]
    ) -> AsyncIterator[Hold]:
        """Hold the lease while the body runs; claim ``Hold.outcome`` when it ends.

        Raises:
            LeaseLost: the heartbeat or the store found a newer epoch (the body, if still
                running, was cancelled); nothing of this run may be published.
        """
        owner = f"{self.worker_id}/{uuid.uuid4().hex[:12]}"
        taken = await self._take(invocation_id, owner, stopping)
        if isinstance(taken, Finished):
            metrics.LEASE_EVENTS.labels("replayed").inc()
            yield Hold(replay=[(e.topic, e.envelope) for e in taken.record.events])
            return
        fence = taken.fence
        if fence.run > 1:
            metrics.LEASE_EVENTS.labels("taken_over").inc()
        lost, done = asyncio.Event(), asyncio.Event()
        task = asyncio.current_task()
        assert task is not None
        heartbeat = asyncio.create_task(self._heartbeat(fence, owner, lost, done, task))
        held = Hold(fence=fence)
        try:
            yield held
        except asyncio.CancelledError:
            if not lost.is_set():
                # Shutdown or revocation: hand the call over at once, not after the TTL.
                await _quietly(asyncio.shield(self.leases.release(fence)))
                raise
            task.uncancel()
            raise self._lost(fence, stopping()) from None
        except StaleLease:
            raise self._lost(fence, stopping()) from None
        finally:
            # Stopped by flag as well as by cancel: a cancel racing a Redis timeout can
            # surface as TimeoutError and be lost; never wait on the heartbeat for long.
            done.set()
            heartbeat.cancel()
            await asyncio.wait([heartbeat], timeout=1)
        if lost.is_set():
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
        self, invocation_id: str, owner: str, stopping: Callable[[], bool]
    ) -> Taken | Finished:
        while True:
            state = await self.leases.acquire(invocation_id, owner)
            if not isinstance(state, Held):
                return state
            if stopping():  # not started here: leave it to the partition's next owner
                raise asyncio.CancelledError
            # Held by a live (or recently dead) worker: wait for its outcome or its TTL.
            await asyncio.sleep(min(max(state.expires_in_s, 0.05), self.poll_max_s))

    async def _heartbeat(
        self,
        fence: Fence,
        owner: str,
        lost: asyncio.Event,
        done: asyncio.Event,
        work: asyncio.Task[object],
    ) -> None:
        interval = self.leases.ttl_s / 3
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), interval)
            if done.is_set():
                return
            try:
                renewed = await self.leases.renew(fence, owner)
            except Exception as exc:  # Redis away: keep trying; the fence decides later
                if done.is_set():
                    return
                log.warning("lease renewal failed: %s", type(exc).__name__)
                continue
            if done.is_set():
                return
            if not renewed:
                lost.set()
                work.cancel()
                return


async def _quietly(step: Awaitable[object]) -> None:
    try:
        await step
    except Exception as exc:  # the TTL frees the lease anyway
        log.info("lease not released: %s", type(exc).__name__)
