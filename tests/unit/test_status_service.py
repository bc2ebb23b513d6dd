"""The status projector over an in-memory Projection (the port's contract, no Postgres)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import pytest

from tests.support.lifecycle import T0, Lifecycle
from toolfleet.events.envelope import new_event
from toolfleet.events.models import CircuitChanged, InvocationStatus
from toolfleet.events.types import EventType, Source
from toolfleet.status.projection import InvocationRow
from toolfleet.status.service import ProjectInput, StatusProjector
from toolfleet.storage.notices import MemoryFinishedNotices

pytestmark = pytest.mark.unit


class MemoryProjection:
    """The Projection port in a dict: what the Postgres adapter does, minus SQL."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], InvocationRow] = {}
        """By ``(tenant_id, invocation_id)``: a row is a call."""
        self.projected: set[tuple[str, str, str]] = set()
        """``(tenant_id, source, event_id)`` of every event projected."""

    async def project(self, call: ProjectInput) -> bool:
        event = (call.tenant_id, call.source, call.event_id)
        if event in self.projected:
            return False
        self.projected.add(event)
        key = (call.tenant_id, call.invocation_id)
        updated = call.transition(self.rows.get(key))
        if updated is not None:
            self.rows[key] = updated
        return True

    async def project_all(self, calls: Sequence[ProjectInput]) -> list[bool]:
        return [await self.project(call) for call in calls]


def _projector() -> tuple[StatusProjector, MemoryProjection]:
    store = MemoryProjection()
    return StatusProjector(projection=store, clock=lambda: datetime(2030, 1, 1, tzinfo=UTC)), store


async def test_projects_once_per_event() -> None:
    projector, store = _projector()
    lc = Lifecycle()
    requested, done = lc.requested(), lc.outcome()
    assert await projector.on_event(requested)
    assert not await projector.on_event(requested)
    assert await projector.on_event(done)
    assert not await projector.on_event(done)
    row = store.rows[lc.tenant, lc.invocation_id]
    assert row.status is InvocationStatus.SUCCESS
    assert len(store.projected) == 2


async def test_events_without_an_invocation_are_not_projected() -> None:
    projector, store = _projector()
    circuit = new_event(
        event_type=EventType.CIRCUIT_CLOSED,
        source=Source.EXECUTOR,
        data=CircuitChanged(circuit_name="c", state="closed", at=T0),
        tenant_id="t",
        invocation_id=None,
    )
    assert not await projector.on_event(circuit)
    assert store.projected == set()
    assert store.rows == {}


async def test_control_event_before_the_row_is_recorded_but_makes_no_row() -> None:
    projector, store = _projector()
    lc = Lifecycle()
    assert await projector.on_event(lc.cancel_requested())
    assert store.rows == {}
    assert len(store.projected) == 1


async def test_terminal_outcomes_are_announced_after_projection_redeliveries_too() -> None:
    store = MemoryProjection()
    notices = MemoryFinishedNotices()
    projector = StatusProjector(projection=store, notices=notices)
    lc = Lifecycle()
    for event in (lc.requested(), lc.authorized(), lc.invoked()):
        await projector.on_event(event)
    assert notices.published == []
    done = lc.outcome()
    with notices.watch(lc.invocation_id) as finished:
        await projector.on_event(done)
        assert finished.is_set()
        # Announced only once the row shows the outcome.
        assert store.rows[lc.tenant, lc.invocation_id].status is InvocationStatus.SUCCESS
    await projector.on_event(done)  # a redelivery: a notice lost to a crash is sent again
    assert notices.published == [lc.invocation_id, lc.invocation_id]


async def test_a_batch_projects_like_one_by_one_and_announces_its_outcomes() -> None:
    one_by_one, batched = MemoryProjection(), MemoryProjection()
    notices = MemoryFinishedNotices()
    first, second = Lifecycle(), Lifecycle()
    circuit = new_event(
        event_type=EventType.CIRCUIT_CLOSED,
        source=Source.EXECUTOR,
        data=CircuitChanged(circuit_name="c", state="closed", at=T0),
        tenant_id="t",
        invocation_id=None,
    )
    # Out of order, two invocations interleaved, a redelivery and an event of no call.
    done = first.outcome()
    events = [
        first.authorized(),
        second.requested(),
        first.requested(),
        circuit,
        done,
        second.authorized(),
        done,
    ]
    reference = StatusProjector(projection=one_by_one, clock=lambda: T0)
    expected = [await reference.on_event(event) for event in events]
    projector = StatusProjector(projection=batched, notices=notices, clock=lambda: T0)

    assert await projector.on_events(events) == expected == [
        True, True, True, False, True, True, False,
    ]  # fmt: skip
    assert batched.rows == one_by_one.rows
    assert batched.rows[first.tenant, first.invocation_id].status is InvocationStatus.SUCCESS
    assert notices.published == [first.invocation_id, first.invocation_id]
