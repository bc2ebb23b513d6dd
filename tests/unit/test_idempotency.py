"""Idempotency domain helpers: the duplicate's outcome, the claim, the conflict error."""

from __future__ import annotations

import uuid

import pytest

from toolfleet.errors import ErrorCode, ErrorInfo
from toolfleet.events.models import ExecutionMetadata, InvocationStatus, ToolOutcome
from toolfleet.policy.idempotency import Claim, ClaimKind, conflict_error, outcome_for_duplicate

pytestmark = pytest.mark.unit


def _first(**extra: object) -> ToolOutcome:
    return ToolOutcome(
        invocation_id=uuid.uuid4(),
        status=InvocationStatus.SUCCESS,
        agent_did="did:agent:first",
        tenant_id="t_acme",
        tool_id="core__echo",
        tool_version="1.0.0",
        result={"message": "hi", "length": 2},
        warnings=["deprecated"],
        execution_metadata=ExecutionMetadata(duration_ms=12, attempts=2),
        **extra,  # type: ignore[arg-type]
    )


def test_duplicate_gets_the_first_outcome_under_its_own_identity() -> None:
    first = _first()
    dup_id = uuid.uuid4()
    dup = outcome_for_duplicate(first, invocation_id=str(dup_id), agent_did="did:agent:second")
    assert dup.invocation_id == dup_id
    assert dup.agent_did == "did:agent:second"
    expect = first.model_dump(exclude={"invocation_id", "agent_did"})
    assert dup.model_dump(exclude={"invocation_id", "agent_did"}) == expect
    assert dup.execution_metadata.cached is False  # copied as the owner reported it
    assert dup.result is not first.result  # a copy, not shared


def test_duplicate_of_a_failure_keeps_the_error() -> None:
    error = ErrorInfo(code=ErrorCode.APPROVAL_DENIED, message="the approval expired")
    first = _first().model_copy(
        update={"status": InvocationStatus.PERMISSION_DENIED, "result": None, "error": error}
    )
    dup = outcome_for_duplicate(first, invocation_id=uuid.uuid4(), agent_did="did:agent:x")
    assert dup.status == InvocationStatus.PERMISSION_DENIED
    assert dup.error == error


def test_claim_parses_the_first_outcome() -> None:
    first = _first()
    claim = Claim(
        kind=ClaimKind.DUPLICATE,
        first_invocation_id=str(first.invocation_id),
        outcome_json=first.model_dump_json(),
    )
    assert claim.first_outcome() == first
    assert Claim(kind=ClaimKind.NEW, first_invocation_id="x").first_outcome() is None


def test_conflict_error() -> None:
    info = conflict_error("idem-1", "inv-1").to_error_info()
    assert info.code == ErrorCode.IDEMPOTENCY_CONFLICT
    assert info.retryable is False
    assert info.details == {"idempotency_key": "idem-1", "first_invocation_id": "inv-1"}
