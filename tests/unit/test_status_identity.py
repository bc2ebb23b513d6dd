"""Status trusts only what policy checked (issue 32): the first write of a row wins, a
request keyed by another tenant projects nothing, an id conflict is not the call's."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import reduce

import pytest

from tests.support.lifecycle import Lifecycle
from tests.unit.test_status_service import MemoryProjection
from toolfleet.errors import ErrorCode, InvalidEvent
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import InvocationStatus
from toolfleet.status.projection import InvocationRow, apply, fact_of
from toolfleet.status.service import ProjectInput, StatusProjector

pytestmark = pytest.mark.unit

NOW = datetime(2030, 1, 1, tzinfo=UTC)


def fold(events: Sequence[Envelope]) -> InvocationRow | None:
    facts = [fact_of(e, now=NOW) for e in events]
    return reduce(apply, [f for f in facts if f is not None], None)


def test_a_later_request_under_the_id_rewrites_nothing_of_the_row() -> None:
    first = Lifecycle()
    swap = dataclasses.replace(
        first, agent="did:agent:mallory", tool_id="core__shell", parameters={"cmd": "rm -rf /"}
    )
    row = fold([first.requested(at=0), first.approval_requested(at=1), swap.requested(at=2)])
    assert row is not None
    assert (row.agent_did, row.tool_id, row.parameters) == (
        first.agent,
        first.tool_id,
        first.parameters,
    )
    assert row.status is InvocationStatus.PENDING_APPROVAL


def test_another_tenants_request_or_outcome_is_ignored() -> None:
    first = Lifecycle()
    other = dataclasses.replace(first, tenant="t_other", agent="did:agent:mallory")
    before = fold([first.requested(at=0), first.approval_requested(at=1)])
    after = fold(
        [
            first.requested(at=0),
            first.approval_requested(at=1),
            other.requested(at=2),
            other.outcome(InvocationStatus.ERROR, at=3),
        ]
    )
    assert after == before


def fold_calls(events: Sequence[Envelope]) -> dict[tuple[str, str], InvocationRow]:
    """The rows ``events`` fold into, by ``(tenant_id, invocation_id)`` as the store keys them."""
    rows: dict[tuple[str, str], InvocationRow] = {}
    for event in events:
        fact = fact_of(event, now=NOW)
        if fact is None:
            continue
        key = (fact.tenant_id, fact.invocation_id)
        row = apply(rows.get(key), fact)
        if row is not None:
            rows[key] = row
    return rows


def conflict(lc: Lifecycle, at: float = 5) -> Envelope:
    return lc.outcome(InvocationStatus.ERROR, code=ErrorCode.INVOCATION_ID_CONFLICT, at=at)


def test_a_conflict_refusal_under_the_same_tenant_changes_nothing_of_the_call_in_any_order() -> (
    None
):
    """The tenant's own later request under its id was refused, not its call: wherever
    the refusal lands among the call's events (results are read apart from the rest), the
    row is the one the call's events alone make."""
    first = Lifecycle()
    swap = dataclasses.replace(first, tool_id="core__shell", parameters={"cmd": "rm -rf /"})
    call = [first.requested(at=0), first.approval_requested(at=1), first.outcome(at=6)]
    refusal = conflict(swap, at=2)
    for end in (2, 3):  # parked for approval; ended
        expected = fold(call[:end])
        for order in itertools.permutations([*call[:end], refusal]):
            assert fold(order) == expected, [e.type for e in order]


def test_another_tenants_request_under_the_id_gets_a_row_of_its_own_ended_by_its_refusal() -> None:
    """Attack 2: tenant A names tenant B's pending id. B's row is what B's events make; A's
    row (the pair key) shows A's request refused with ``invocation_id_conflict``."""
    victim = Lifecycle()
    attacker = dataclasses.replace(
        victim, tenant="t_other", agent="did:agent:mallory", parameters={"message": "x"}
    )
    mine = [victim.requested(at=0), victim.approval_requested(at=1)]
    theirs = [attacker.requested(at=2), conflict(attacker, at=3)]
    for order in itertools.permutations([*mine, *theirs]):
        rows = fold_calls(order)
        assert rows[victim.tenant, victim.invocation_id] == fold(mine)
        refused = rows[attacker.tenant, attacker.invocation_id]
        assert refused.status is InvocationStatus.ERROR
        assert (refused.error or {})["code"] == ErrorCode.INVOCATION_ID_CONFLICT
        assert (refused.agent_did, refused.parameters) == (attacker.agent, attacker.parameters)
        assert refused.tool_version is None  # nothing was resolved for it


def test_another_tenants_request_that_comes_first_takes_nothing_of_the_id() -> None:
    """A request of tenant A under an id arrives before tenant B's first request of it:
    B's row is still B's, as B's events alone make it (it was A's row before)."""
    victim = Lifecycle()
    attacker = dataclasses.replace(victim, tenant="t_other", agent="did:agent:mallory")
    mine = [victim.requested(at=1), victim.approval_requested(at=2)]
    rows = fold_calls([attacker.requested(at=0), *mine])
    assert rows[victim.tenant, victim.invocation_id] == fold(mine)
    assert rows[attacker.tenant, attacker.invocation_id].agent_did == attacker.agent


def test_a_conflict_refusal_without_its_request_still_makes_the_senders_row() -> None:
    refusal = conflict(Lifecycle())
    row = fold([refusal])
    assert row is not None
    assert row.status is InvocationStatus.ERROR
    assert row.agent_did is None  # a refusal fixes no identity: the request fills it


async def test_two_tenants_events_of_one_source_and_id_are_each_projected_on_their_own_row() -> (
    None
):
    """The dedupe key has the tenant (as ``Envelope.dedupe_key``): another tenant's event
    that reuses a source and id is neither a redelivery nor dropped as one."""
    projection = MemoryProjection()
    projector = StatusProjector(projection=projection)
    victim = Lifecycle()
    attacker = dataclasses.replace(victim, tenant="t_other")
    requested = victim.requested()
    reused = attacker.requested().model_copy(update={"id": requested.id})
    assert await projector.on_events([requested, reused, requested]) == [True, True, False]
    assert set(projection.rows) == {
        (victim.tenant, victim.invocation_id),
        (attacker.tenant, attacker.invocation_id),
    }


class _Recording:
    def __init__(self) -> None:
        self.calls: list[ProjectInput] = []

    async def project(self, call: ProjectInput) -> bool:
        self.calls.append(call)
        return True

    async def project_all(self, calls: Sequence[ProjectInput]) -> list[bool]:
        self.calls.extend(calls)
        return [True] * len(calls)


@pytest.mark.parametrize(
    "key", [b"t_victim", b"\xff\xfe", b"t_acme "], ids=["another", "garbage", "near"]
)
async def test_a_request_keyed_by_another_tenant_raises_before_anything_is_projected(
    key: bytes,
) -> None:
    projection = _Recording()
    projector = StatusProjector(projection=projection)
    lc = Lifecycle()
    with pytest.raises(InvalidEvent) as raised:
        await projector.on_events([lc.authorized(), lc.requested()], [b"t_acme", key])
    assert raised.value.details == {"reason": "key_tenant_mismatch"}
    assert projection.calls == []
    assert await projector.on_events([lc.requested()], [b"t_acme"]) == [True]
