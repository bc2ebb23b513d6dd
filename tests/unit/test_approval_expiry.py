"""The approval expiry sweeper loop and the outcome of an expired approval (offline)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest

from tests.support.eventually import eventually
from toolfleet.errors import ErrorCode
from toolfleet.events.identity import CallKey
from toolfleet.events.models import (
    AgentContext,
    Effect,
    InvocationStatus,
    InvokeAuthorized,
    ToolOutcome,
)
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.policy.approval_expiry import expiry_outcome, run_expiry_sweeper
from toolfleet.policy.service import PendingApproval

pytestmark = pytest.mark.unit

TRACE = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def pending_approval(*, expires_at: datetime | None = None) -> PendingApproval:
    invocation_id = uuid.uuid4()
    return PendingApproval(
        authorized=InvokeAuthorized(
            invocation_id=invocation_id,
            tool_id="core__echo",
            tool_version="1.0.0",
            requested_version="*",
            agent_context=AgentContext(agent_did="did:agent:a", tenant_id="t_acme"),
            parameters={"message": "hi"},
            effect=Effect.EXTERNAL_SIDE_EFFECT,
            timeout_seconds=30,
            requested_at=datetime.now(UTC),
        ),
        parameters_hash="h",
        expires_at=expires_at or datetime.now(UTC),
        tenant_id="t_acme",
        traceparent=TRACE,
        authid="did:agent:a",
    )


def test_expiry_outcome_is_a_deterministic_approval_denied() -> None:
    pending = pending_approval()
    topic, event = expiry_outcome(pending)
    assert topic == TopicName.RESULTS
    assert event.type == EventType.FAILED
    assert event.source == Source.POLICY
    assert event.traceparent == TRACE
    assert event.tenantid == "t_acme"
    assert event.invocationid == str(pending.authorized.invocation_id)
    outcome = event.data_as(ToolOutcome)
    assert outcome.status == InvocationStatus.PERMISSION_DENIED
    assert outcome.error is not None
    assert outcome.error.code == ErrorCode.APPROVAL_DENIED
    assert outcome.tool_version == "1.0.0"
    assert expiry_outcome(pending)[1].id == event.id


@dataclass
class FakeStore:
    """Hands out each queued approval once; remembers acknowledgements."""

    queued: list[PendingApproval] = field(default_factory=list)
    acked: list[CallKey] = field(default_factory=list)
    calls: int = 0
    fail_next: bool = False

    async def due(self, now: datetime, *, limit: int = 100) -> list[PendingApproval]:
        self.calls += 1
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("redis down")
        due = [p for p in self.queued if p.expires_at <= now][:limit]
        self.queued = [p for p in self.queued if p not in due]
        return due

    async def ack(self, call: CallKey) -> None:
        self.acked.append(call)


async def test_sweeper_emits_then_acks_and_survives_failures() -> None:
    ok, broken = pending_approval(), pending_approval()
    later = pending_approval(expires_at=datetime.now(UTC) + timedelta(hours=1))
    store = FakeStore(queued=[ok, broken, later], fail_next=True)
    emitted: list[PendingApproval] = []

    async def emit(pending: PendingApproval) -> None:
        if pending is broken:
            raise RuntimeError("broker down")
        emitted.append(pending)

    stop = asyncio.Event()
    task = asyncio.create_task(run_expiry_sweeper(store, emit, stop, interval_s=0.01))

    async def swept() -> bool:
        return store.calls >= 3 and bool(store.acked)

    await eventually(swept, timeout=5)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert emitted == [ok]
    assert store.acked == [
        CallKey(tenant_id=ok.tenant_id, invocation_id=str(ok.authorized.invocation_id))
    ]  # the failed one stays leased
    assert store.queued == [later]


async def test_sweeper_drains_full_batches_without_waiting() -> None:
    store = FakeStore(queued=[pending_approval() for _ in range(25)])
    emitted: list[PendingApproval] = []

    async def emit(pending: PendingApproval) -> None:
        emitted.append(pending)

    stop = asyncio.Event()
    task = asyncio.create_task(run_expiry_sweeper(store, emit, stop, interval_s=60, batch=10))

    async def drained() -> bool:
        return len(emitted) == 25

    await eventually(drained, timeout=5)
    stop.set()
    await asyncio.wait_for(task, 5)  # stop wakes the 60 s wait at once
