"""Policy's control path over in-memory twins: only signed decisions change a parked call."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from toolfleet.auth.control import ControlSigner, ControlVerifier, control_claims
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.identity import CallKey
from toolfleet.events.models import (
    AgentContext,
    ApprovalDecision,
    CancelRequested,
    Effect,
    InvokeAuthorized,
)
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.policy.memory_stores import MemoryApprovalStore
from toolfleet.policy.service import PendingApproval, PolicyService
from toolfleet.storage.cancel_flags import MemoryCancelFlags
from toolfleet.storage.revocation import MemoryRevocationList

pytestmark = pytest.mark.unit

KEY = b"g" * 32
TENANT = "t_acme"
DIGEST = "e" * 64


def _service(
    approvals: MemoryApprovalStore, cancels: MemoryCancelFlags, revocations: MemoryRevocationList
) -> PolicyService:
    unused = cast(Any, None)  # the control path never resolves tools or verifies tokens
    return PolicyService(
        lookup=unused,
        verifier=None,
        policies=unused,
        schemas=unused,
        approvals=approvals,
        cancels=cancels,
        limiter=unused,
        idempotency=unused,
        revocations=revocations,
        control=ControlVerifier([KEY]),
    )


def _parked(approvals: MemoryApprovalStore) -> str:
    invocation_id = uuid.uuid4()
    call = CallKey(tenant_id=TENANT, invocation_id=str(invocation_id))
    approvals.pending[call] = PendingApproval(
        authorized=InvokeAuthorized(
            invocation_id=invocation_id,
            tool_id="core__echo",
            tool_version="1.0.0",
            requested_version="*",
            agent_context=AgentContext(agent_did="did:agent:a", tenant_id=TENANT),
            parameters={"message": "hi"},
            effect=Effect.EXTERNAL_SIDE_EFFECT,
            timeout_seconds=30,
            requested_at=datetime.now(UTC),
        ),
        parameters_hash=DIGEST,
        expires_at=datetime.now(UTC) + timedelta(hours=1),
        tenant_id=TENANT,
        traceparent=None,
        authid="did:agent:a",
        capability_jti="cap-1",
    )
    return str(invocation_id)


def _control(
    event_type: EventType, data: ApprovalDecision | CancelRequested, *, key: bytes | None = KEY
) -> Envelope:
    if key is not None:
        signature = ControlSigner(key).sign(control_claims(event_type, data))
        data = data.model_copy(update={"signature": signature})
    return new_event(
        event_type=event_type,
        source=Source.API,
        data=data,
        tenant_id=data.tenant_id,
        invocation_id=str(data.invocation_id),
    )


def _approval(invocation_id: str, **over: Any) -> ApprovalDecision:
    fields: dict[str, Any] = {
        "invocation_id": uuid.UUID(invocation_id),
        "tenant_id": TENANT,
        "approver": "did:user:alice",
        "parameters_hash": DIGEST,
        **over,
    }
    return ApprovalDecision(**fields)


async def test_unsigned_forged_and_tampered_decisions_are_refused_and_change_nothing() -> None:
    approvals, cancels = MemoryApprovalStore(), MemoryCancelFlags()
    service = _service(approvals, cancels, MemoryRevocationList())
    invocation_id = _parked(approvals)
    signed = _control(EventType.APPROVAL_GRANTED, _approval(invocation_id))
    tampered = signed.model_copy(update={"data": {**signed.data, "approver": "did:user:eve"}})
    attempts = [
        _control(EventType.APPROVAL_GRANTED, _approval(invocation_id), key=None),
        _control(EventType.APPROVAL_GRANTED, _approval(invocation_id), key=b"x" * 32),
        tampered,
        _control(
            EventType.CANCEL_REQUESTED,
            CancelRequested(invocation_id=uuid.UUID(invocation_id), tenant_id=TENANT),
            key=None,
        ),
    ]
    for attempt in attempts:
        ((topic, refusal),) = await service.on_control(attempt, TENANT.encode())
        assert (topic, refusal.type) == (TopicName.EVENTS, EventType.CONTROL_REFUSED)
        assert refusal.data["refused_event_id"] == attempt.id
        assert refusal.authtype is None
    assert _key(invocation_id) in approvals.pending
    assert not cancels.requested  # an unsigned cancel does not even flag the call

    ((topic, authorized),) = await service.on_control(signed, TENANT.encode())
    assert (topic, authorized.type) == (TopicName.AUTHORIZED, EventType.INVOKE_AUTHORIZED)
    assert _key(invocation_id) not in approvals.pending


async def test_an_approval_of_a_revoked_requester_is_permission_denied() -> None:
    approvals, revocations = MemoryApprovalStore(), MemoryRevocationList()
    service = _service(approvals, MemoryCancelFlags(), revocations)
    invocation_id = _parked(approvals)
    await revocations.revoke("cap-1", ttl_s=60)
    ((topic, outcome),) = await service.on_control(
        _control(EventType.APPROVAL_GRANTED, _approval(invocation_id)), TENANT.encode()
    )
    assert (topic, outcome.type) == (TopicName.RESULTS, EventType.FAILED)
    assert outcome.data["status"] == "permission_denied"
    assert outcome.data["error"]["code"] == "permission_denied"
    assert _key(invocation_id) not in approvals.pending


async def test_without_a_key_every_control_event_is_refused() -> None:
    approvals = MemoryApprovalStore()
    service = _service(approvals, MemoryCancelFlags(), MemoryRevocationList())
    service.control = None
    invocation_id = _parked(approvals)
    ((_, refusal),) = await service.on_control(
        _control(EventType.APPROVAL_GRANTED, _approval(invocation_id)), TENANT.encode()
    )
    assert refusal.type == EventType.CONTROL_REFUSED
    assert "no control signing key" in refusal.data["reason"]
    assert _key(invocation_id) in approvals.pending


def _key(invocation_id: str) -> CallKey:
    """The call of ``invocation_id`` in the test's tenant (what stores are keyed by)."""
    return CallKey(tenant_id=TENANT, invocation_id=invocation_id)
