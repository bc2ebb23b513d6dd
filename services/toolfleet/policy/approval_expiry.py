"""Pending approvals that nobody decided in time end with ``approval_denied``.

Every parked approval is indexed by its expiry (``approval:expiries``, see
:class:`toolfleet.policy.redis_stores.RedisApprovalStore`). :func:`run_expiry_sweeper` asks
the store for the approvals that are due, hands each to ``emit`` (which publishes the
terminal outcome, e.g. :func:`expiry_outcome`) and then acknowledges it. The store
leases a claimed approval to one sweeper at a time, so policy replicas never end one
twice; a sweeper that dies between claim and acknowledgement leaves the approval to be
claimed again when the lease runs out, and :func:`expiry_outcome` builds the same event
id every time, so downstream dedupe (``source`` + ``id``) collapses the repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Protocol

from toolfleet.errors import ApprovalDenied
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import CallKey, CallRef
from toolfleet.events.outcomes import failure_event
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.policy.service import PendingApproval

__all__ = ["EXPIRED_MESSAGE", "ExpiringApprovals", "expiry_outcome", "run_expiry_sweeper"]

log = logging.getLogger(__name__)

EXPIRED_MESSAGE = "the approval expired"
"""The ``approval_denied`` message of an approval nobody decided in time."""


class ExpiringApprovals(Protocol):
    """The port the sweeper claims expired approvals through."""

    async def due(self, now: datetime, *, limit: int = 100) -> list[PendingApproval]:
        """Claim up to ``limit`` approvals whose expiry is at or before ``now``.

        A claimed approval is no longer returned by ``take`` nor by another ``due``
        call until its lease runs out without :meth:`ack`.
        """
        ...

    async def ack(self, call: CallKey) -> None:
        """Forget a claimed approval for good, once its outcome is published."""
        ...


def expiry_outcome(pending: PendingApproval) -> tuple[TopicName, Envelope]:
    """The ``approval_denied`` terminal outcome of an expired approval.

    Deterministic: the same approval always yields the same event id, so a repeat after
    a crash is one event downstream. It continues the original request's trace.
    """
    auth = pending.authorized
    invocation_id = str(auth.invocation_id)
    # The expiry has no triggering event; a stable stand-in parent gives the outcome a
    # deterministic id and the request's trace context.
    parent = Envelope(
        id=f"approval-expiry:{invocation_id}",
        source=str(Source.POLICY),
        type=str(EventType.APPROVAL_REQUESTED),
        tenantid=pending.tenant_id,
        invocationid=invocation_id,
        traceparent=pending.traceparent,
    )
    return (
        TopicName.RESULTS,
        failure_event(
            parent,
            Source.POLICY,
            ApprovalDenied(EXPIRED_MESSAGE, details={"expired_at": pending.expires_at.isoformat()}),
            call=CallRef.of(auth, trace=pending.traceparent),
            warnings=list(auth.warnings),
        ),
    )


async def run_expiry_sweeper(
    store: ExpiringApprovals,
    emit: Callable[[PendingApproval], Awaitable[None]],
    stop: asyncio.Event,
    interval_s: float = 1.0,
    *,
    batch: int = 100,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> None:
    """End expired approvals until ``stop`` is set.

    Each due approval is passed to ``emit`` and acknowledged only after ``emit``
    returns; when ``emit`` raises, the approval stays leased and is retried after the
    lease. Store errors (Redis down) are logged and retried every ``interval_s``.
    """
    while not stop.is_set():
        claimed = 0
        try:
            due = await store.due(clock(), limit=batch)
            claimed = len(due)
            for pending in due:
                await _end(store, emit, pending)
        except Exception:
            log.exception("approval expiry sweep failed; retrying in %.1fs", interval_s)
        if claimed >= batch:
            continue  # more may be due: sweep again at once
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)


async def _end(
    store: ExpiringApprovals,
    emit: Callable[[PendingApproval], Awaitable[None]],
    pending: PendingApproval,
) -> None:
    invocation_id = str(pending.authorized.invocation_id)
    try:
        await emit(pending)
    except Exception:
        log.exception(
            "could not publish the expiry of approval %s; it will be retried", invocation_id
        )
        return
    await store.ack(CallKey(tenant_id=pending.tenant_id, invocation_id=invocation_id))
