"""The status projector over a :class:`Projection` port: no Postgres imports here."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import check_key_tenant
from toolfleet.events.types import EventType
from toolfleet.status.projection import Fact, InvocationRow, apply, fact_of

log = logging.getLogger(__name__)

Transition = Callable[[InvocationRow | None], InvocationRow | None]


@dataclass(frozen=True, kw_only=True)
class ProjectInput:
    """One event to fold into one invocation's row."""

    source: str
    """``source`` of the event; with ``event_id`` and ``tenant_id`` its idempotency key."""
    event_id: str
    tenant_id: str
    """With ``invocation_id``, the row's key; with ``source`` and ``event_id``, the
    event's (as :attr:`~toolfleet.events.envelope.Envelope.dedupe_key`: another tenant's
    event that reuses a source and id is not a redelivery of this one)."""
    invocation_id: str
    transition: Transition
    """Pure: the row as it is (``None`` if absent) → the row to store (``None``: none)."""
    kind: str | None = None
    """What the event says (:class:`~toolfleet.status.projection.Kind`), kept with the
    dedupe marker for the console's timeline."""
    occurred_at: datetime | None = None
    """When it happened (the event's ``time``)."""
    detail: dict[str, Any] = field(default_factory=dict)
    """The timeline's detail of the event (attempt, worker, checkpoint, status)."""


class Projection(Protocol):
    """Where rows live (Postgres: :class:`toolfleet.status.store.PostgresProjection`)."""

    async def project(self, call: ProjectInput) -> bool:
        """Atomically record ``tenant_id``+``source``+``event_id`` and apply
        ``transition`` to the row of ``(tenant_id, invocation_id)``.

        Returns ``False`` (and changes nothing) when that event was projected before.
        Implementations serialize calls for one invocation.
        """
        ...

    async def project_all(self, calls: Sequence[ProjectInput]) -> list[bool]:
        """:meth:`project` of each call, in order, as one batch (several events of one
        invocation included)."""
        ...


class FinishedPublisher(Protocol):
    """Where "the outcome is stored" goes (Redis: :mod:`toolfleet.storage.notices`)."""

    async def publish(self, invocation_id: str) -> None:
        """Tell waiters (a synchronous HTTP invoke) to read the row now."""
        ...

    async def publish_all(self, invocation_ids: Sequence[str]) -> None:
        """:meth:`publish` of each, in one round trip."""
        ...


class _NoNotices:
    async def publish(self, invocation_id: str) -> None:
        return None

    async def publish_all(self, invocation_ids: Sequence[str]) -> None:
        return None


@dataclass(kw_only=True)
class StatusProjector:
    """Folds lifecycle events into rows, once per event."""

    projection: Projection
    notices: FinishedPublisher = field(default_factory=_NoNotices)
    """Told after every terminal outcome is committed (redeliveries included: a notice
    lost to a crash between commit and publish is sent again)."""
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)

    async def on_event(self, event: Envelope) -> bool:
        """Project ``event``; ``False`` if it names no invocation or was seen before."""
        fact = fact_of(event, now=self.clock())
        if fact is None:
            return False
        projected = await self.projection.project(_input(event, fact))
        if not projected:
            log.debug("event already projected", extra={"event_type": event.type})
        if fact.status is not None and fact.status.is_terminal:
            await self.notices.publish(fact.invocation_id)
        return projected

    async def on_events(
        self, events: Sequence[Envelope], keys: Sequence[bytes | None] | None = None
    ) -> list[bool]:
        """:meth:`on_event` of each event, as one batch: one projection round trip and
        one round trip of notices.

        ``keys``: each event's Kafka key. A request keyed by another tenant than it names
        raises :class:`~toolfleet.errors.InvalidEvent` (``key_tenant_mismatch``) before
        anything of the batch is projected: the consumer then handles the batch one
        event at a time and dead-letters that one.
        """
        if keys is not None:
            for event, key in zip(events, keys, strict=True):
                if event.type == EventType.INVOKE_REQUESTED:
                    check_key_tenant(event, key)
        now = self.clock()
        facts = [(event, fact_of(event, now=now)) for event in events]
        calls = [_input(event, fact) for event, fact in facts if fact is not None]
        projected = iter(await self.projection.project_all(calls) if calls else [])
        results = [False if fact is None else next(projected) for _, fact in facts]
        finished = [
            fact.invocation_id
            for _, fact in facts
            if fact is not None and fact.status is not None and fact.status.is_terminal
        ]
        if finished:
            await self.notices.publish_all(finished)
        return results


def _input(event: Envelope, fact: Fact) -> ProjectInput:
    return ProjectInput(
        source=event.source,
        event_id=event.id,
        tenant_id=fact.tenant_id,
        invocation_id=fact.invocation_id,
        transition=lambda row: apply(row, fact),
        kind=fact.kind.value,
        occurred_at=fact.occurred_at,
        detail=fact.timeline_detail(),
    )
