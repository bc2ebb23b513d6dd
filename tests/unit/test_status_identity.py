"""Status trusts only what policy checked (issue 32): the first write of a row wins, a
request keyed by another tenant projects nothing, an id conflict is not the call's."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime
from functools import reduce

import pytest

from tests.support.lifecycle import Lifecycle
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


def test_an_invocation_id_conflict_outcome_is_not_projected() -> None:
    first = Lifecycle()
    refusal = first.outcome(InvocationStatus.ERROR, code=ErrorCode.INVOCATION_ID_CONFLICT)
    assert fact_of(refusal, now=NOW) is None
    row = fold([first.requested(at=0), first.approval_requested(at=1), refusal])
    assert row is not None
    assert row.status is InvocationStatus.PENDING_APPROVAL


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
