"""The status projection's rules: order-independent, monotonic, idempotent."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from functools import reduce

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.lifecycle import T0, Lifecycle
from toolfleet.errors import ErrorCode, InvalidEvent
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.models import CircuitChanged, InvocationStatus
from toolfleet.events.types import EventType, Source
from toolfleet.status.projection import (
    Fact,
    InvocationRow,
    apply,
    fact_of,
    status_rank,
)

pytestmark = pytest.mark.unit

NOW = datetime(2030, 1, 1, tzinfo=UTC)
S = InvocationStatus


def _facts(events: Sequence[Envelope]) -> list[Fact]:
    facts = [fact_of(e, now=NOW) for e in events]
    assert all(f is not None for f in facts)
    return [f for f in facts if f is not None]


def _fold(facts: Sequence[Fact]) -> InvocationRow | None:
    return reduce(apply, facts, None)


def happy(lc: Lifecycle) -> list[Envelope]:
    return [
        lc.requested(at=0),
        lc.authorized(at=1),
        lc.invoked(at=2),
        lc.checkpoint(30, "fetching", at=3),
        lc.checkpoint(70, "parsing", at=4),
        lc.checkpoint(80, at=4.5),
        lc.executed(at=5),
        lc.outcome(S.SUCCESS, at=6),
    ]


def approved(lc: Lifecycle) -> list[Envelope]:
    return [
        lc.requested(at=0),
        lc.approval_requested(at=1),
        lc.approval(granted=True, at=2),
        lc.authorized(at=3),
        lc.invoked(at=4),
        lc.executed(at=5),
        lc.outcome(S.SUCCESS, at=6),
    ]


def denied(lc: Lifecycle) -> list[Envelope]:
    return [
        lc.requested(at=0),
        lc.approval_requested(at=1),
        lc.approval(granted=False, at=2),
        lc.outcome(S.PERMISSION_DENIED, code=ErrorCode.APPROVAL_DENIED, at=3),
    ]


def cancelled(lc: Lifecycle) -> list[Envelope]:
    return [
        lc.requested(at=0),
        lc.authorized(at=1),
        lc.invoked(at=2),
        lc.checkpoint(20, "step 1", at=3),
        lc.cancel_requested(at=4),
        lc.outcome(S.CANCELLED, code=ErrorCode.CANCELLED, at=5),
    ]


def failed(lc: Lifecycle) -> list[Envelope]:
    return [
        lc.requested(at=0),
        lc.authorized(at=1),
        lc.invoked(at=2),
        lc.invoked(at=3, attempt=2),
        lc.outcome(S.ERROR, at=4),
    ]


def in_flight(lc: Lifecycle) -> list[Envelope]:
    """No terminal and no control events: still converges."""
    return [
        lc.requested(at=0),
        lc.authorized(at=1),
        lc.invoked(at=2),
        lc.checkpoint(10, "a", at=3),
        lc.checkpoint(60, "b", at=4),
    ]


LIFECYCLES: dict[str, Callable[[Lifecycle], list[Envelope]]] = {
    "happy": happy,
    "approved": approved,
    "denied": denied,
    "cancelled": cancelled,
    "failed": failed,
    "in_flight": in_flight,
}


@st.composite
def shuffled(draw: st.DrawFn) -> tuple[list[Fact], list[Fact]]:
    """A lifecycle's facts in order, and the same facts shuffled with some repeated."""
    make = draw(st.sampled_from(list(LIFECYCLES.values())))
    facts = _facts(make(Lifecycle()))
    order = draw(st.permutations(facts))
    repeats = draw(st.lists(st.sampled_from(facts), max_size=4))
    mixed = list(order)
    for fact in repeats:
        mixed.insert(draw(st.integers(0, len(mixed))), fact)
    return facts, mixed


@given(shuffled())
@settings(max_examples=300)
def test_every_ordering_yields_the_same_row(case: tuple[list[Fact], list[Fact]]) -> None:
    in_order, mixed = case
    assert _fold(mixed) == _fold(in_order)


@given(shuffled())
@settings(max_examples=200)
def test_rank_and_progress_never_go_back(case: tuple[list[Fact], list[Fact]]) -> None:
    _, mixed = case
    row: InvocationRow | None = None
    for fact in mixed:
        after = apply(row, fact)
        if row is not None:
            assert after is not None
            assert after.status_rank >= row.status_rank
            assert after.progress_percent >= row.progress_percent
            if row.status.is_terminal:
                assert after.status == row.status
                assert after.result == row.result
                assert after.error == row.error
        # applying the same fact again changes nothing
        assert apply(after, fact) == after
        row = after


def test_happy_path_row() -> None:
    lc = Lifecycle(parameters={"message": "hi", "password": "hunter2", "to": "bob@example.com"})
    row = _fold(_facts(happy(lc)))
    assert row is not None
    assert row.status is S.SUCCESS
    assert row.status_rank == 3
    assert row.current_phase == "completed"
    assert row.progress_percent == 100
    assert row.tenant_id == lc.tenant
    assert row.agent_did == lc.agent
    assert row.user_did == "did:user:u1"
    assert row.tool_id == lc.tool_id
    assert row.tool_version == lc.version
    assert row.requested_version == "^1.0.0"
    assert row.priority == "high"
    assert row.idempotency_key == "idem-1"
    assert row.parameters == {
        "message": "hi",
        "password": "[REDACTED]",
        "to": "[REDACTED:email]",
    }
    assert row.result == {"message": "hi", "length": 2}
    assert row.error is None
    assert row.warnings == ("tool core__echo@1.0.0 is deprecated",)
    assert row.execution_metadata is not None
    assert row.execution_metadata["duration_ms"] == 1500
    assert row.trace_id == lc.traceparent[3:35]
    assert row.created_at == T0
    assert row.started_at == T0 + timedelta(seconds=2)
    assert row.completed_at == T0 + timedelta(seconds=5)
    assert row.latest_checkpoint is not None
    assert row.latest_checkpoint.checkpoint_id == "cp-80"
    assert row.latest_checkpoint.to_json()["progress_percent"] == 80


def test_phases_along_the_way() -> None:
    lc = Lifecycle()
    events = happy(lc)
    phases, statuses = [], []
    row: InvocationRow | None = None
    for fact in _facts(events):
        row = apply(row, fact)
        assert row is not None
        phases.append(row.current_phase)
        statuses.append(row.status)
    assert phases == [
        "",
        "authorized",
        "running",
        "fetching",
        "parsing",
        "running",
        "validating",
        "completed",
    ]
    assert statuses == [
        S.PENDING,
        S.PENDING,
        S.RUNNING,
        S.RUNNING,
        S.RUNNING,
        S.RUNNING,
        S.RUNNING,
        S.SUCCESS,
    ]


def test_approval_phases() -> None:
    lc = Lifecycle()
    facts = _facts(approved(lc))
    row = _fold(facts[:2])
    assert row is not None
    assert row.status is S.PENDING_APPROVAL
    assert row.current_phase == "awaiting_approval"
    row = apply(row, facts[2])
    assert row is not None
    assert row.current_phase == "approved"
    assert row.status is S.PENDING_APPROVAL  # only invoked moves it on


def test_cancel_request_sets_the_phase_only() -> None:
    lc = Lifecycle()
    row = _fold(_facts([lc.requested(), lc.authorized(), lc.invoked(), lc.cancel_requested()]))
    assert row is not None
    assert row.status is S.RUNNING
    assert row.current_phase == "cancel_requested"


def test_late_invoked_after_terminal_changes_nothing() -> None:
    lc = Lifecycle()
    facts = _facts([lc.requested(), lc.outcome(S.SUCCESS)])
    done = _fold(facts)
    late = _facts([lc.invoked(at=2), lc.checkpoint(10, "x", at=3), lc.approval_requested()])
    after = _fold([*facts, *late])
    assert done is not None
    assert after is not None
    assert after.status is S.SUCCESS
    assert after.current_phase == "completed"
    assert after.progress_percent == 100
    assert after.started_at == T0 + timedelta(seconds=2)  # the one fact still unknown


def test_terminal_first_creates_the_row() -> None:
    lc = Lifecycle()
    row = _fold(_facts([lc.outcome(S.ERROR)]))
    assert row is not None
    assert row.status is S.ERROR
    assert row.tool_id == lc.tool_id
    assert row.tenant_id == lc.tenant
    assert row.error is not None
    assert row.error["code"] == "tool_execution_error"
    assert row.parameters is None
    row = apply(row, _facts([lc.requested()])[0])
    assert row is not None
    assert row.parameters == {"message": "hi"}
    assert row.created_at == T0
    assert row.status is S.ERROR


def test_control_events_without_a_row_are_skipped() -> None:
    lc = Lifecycle()
    for event in (lc.cancel_requested(), lc.approval(granted=True), lc.approval(granted=False)):
        assert apply(None, _facts([event])[0]) is None


def test_first_terminal_wins() -> None:
    lc = Lifecycle()
    row = _fold(_facts([lc.outcome(S.TIMEOUT, code=ErrorCode.TIMEOUT), lc.outcome(S.SUCCESS)]))
    assert row is not None
    assert row.status is S.TIMEOUT
    assert row.result is None


def test_another_tenants_event_never_touches_the_row() -> None:
    mine, theirs = Lifecycle(), Lifecycle(tenant="t_evil")
    theirs.invocation_id = mine.invocation_id
    row = _fold(_facts([mine.requested()]))
    for event in (theirs.cancel_requested(), theirs.outcome(S.ERROR), theirs.requested()):
        assert apply(row, _facts([event])[0]) == row


def test_progress_only_goes_up() -> None:
    lc = Lifecycle()
    row = _fold(_facts([lc.requested(), lc.checkpoint(60, "b", at=4), lc.checkpoint(30, "a")]))
    assert row is not None
    assert row.progress_percent == 60
    assert row.current_phase == "b"


def test_status_rank() -> None:
    assert [status_rank(s) for s in S] == [0, 1, 1, 2, 3, 3, 3, 3, 3]  # queued shares 1


def test_facts_of_events_that_name_no_invocation_or_do_not_parse() -> None:
    circuit = new_event(
        event_type=EventType.CIRCUIT_OPENED,
        source=Source.EXECUTOR,
        data=CircuitChanged(circuit_name="c", state="open", at=T0),
        tenant_id="t",
        invocation_id=None,
    )
    assert fact_of(circuit, now=NOW) is None
    lc = Lifecycle()
    bad_request = lc.requested(unexpected_field=True)
    assert fact_of(bad_request, now=NOW) is None  # strict model: policy reports it
    spoofed = lc.requested().model_copy(update={"tenantid": "t_other"})
    assert fact_of(spoofed, now=NOW) is None
    other_id = lc.requested().model_copy(update={"invocationid": str(uuid.uuid4())})
    assert fact_of(other_id, now=NOW) is None  # attribute and body disagree
    outcome = lc.outcome()
    not_terminal = outcome.model_copy(update={"data": {**outcome.data, "status": "running"}})
    with pytest.raises(InvalidEvent):
        fact_of(not_terminal, now=NOW)
    broken = lc.invoked().model_copy(update={"data": {"invocation_id": lc.invocation_id}})
    with pytest.raises(InvalidEvent):
        fact_of(broken, now=NOW)


def test_event_without_time_uses_now() -> None:
    event = Lifecycle().requested().model_copy(update={"time": None})
    fact = fact_of(event, now=NOW)
    assert fact is not None
    assert fact.occurred_at == NOW
