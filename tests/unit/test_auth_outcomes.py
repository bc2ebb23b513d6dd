"""Outcome signatures: what the fleet's services sign, readers check, and nobody else forges."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolfleet.auth.outcomes import OutcomeSigner, OutcomeVerifier, screen
from toolfleet.errors import ErrorCode, ErrorInfo
from toolfleet.events import routing
from toolfleet.events.codec import ContentMode, decode, encode
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.models import (
    InvocationStatus,
    OutcomeRefusalKind,
    OutcomeRefused,
    ToolOutcome,
)
from toolfleet.events.outcomes import outcome_event
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.settings import FleetSettings
from toolfleet.worker import SERVICES, _outcome_sealer

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
SIGNER = OutcomeSigner(KEY)
VERIFIER = OutcomeVerifier([KEY])


def _outcome(
    status: InvocationStatus = InvocationStatus.SUCCESS,
    *,
    invocation_id: uuid.UUID | None = None,
    tenant: str = "t_acme",
    result: dict[str, Any] | None = None,
) -> Envelope:
    success = status is InvocationStatus.SUCCESS
    outcome = ToolOutcome(
        invocation_id=invocation_id or uuid.uuid4(),
        status=status,
        agent_did="did:agent:a",
        tenant_id=tenant,
        tool_id="core__echo",
        tool_version="1.0.0",
        result=(result or {"message": "hi"}) if success else None,
        error=None if success else ErrorInfo(code=ErrorCode.TOOL_EXECUTION_ERROR, message="x"),
    )
    parent = new_event(
        event_type=EventType.INVOKE_REQUESTED,
        source=Source.CLIENT,
        data={},
        tenant_id=tenant,
        invocation_id=str(outcome.invocation_id),
    )
    return outcome_event(parent, Source.VALIDATOR, outcome)


def _kind(event: Envelope, verifier: OutcomeVerifier = VERIFIER) -> OutcomeRefusalKind | None:
    refusal = verifier.refusal(event)
    return None if refusal is None else refusal.kind


def _with_data(event: Envelope, **changes: Any) -> Envelope:
    return event.model_copy(update={"data": {**event.data, **changes}})


@pytest.mark.parametrize("status", [s for s in InvocationStatus if s.is_terminal])
def test_a_sealed_outcome_of_every_status_verifies(status: InvocationStatus) -> None:
    sealed = SIGNER.seal(_outcome(status))
    assert isinstance(sealed.data["signature"], str)
    assert _kind(sealed) is None
    assert sealed.data_as(ToolOutcome).signature == sealed.data["signature"]


def test_an_unsigned_outcome_is_refused() -> None:
    assert _kind(_outcome()) is OutcomeRefusalKind.UNSIGNED
    assert _kind(_with_data(SIGNER.seal(_outcome()), signature=None)) is (
        OutcomeRefusalKind.UNSIGNED
    )


def test_a_signature_of_another_key_is_refused() -> None:
    forged = OutcomeSigner(OTHER_KEY).seal(_outcome())
    assert _kind(forged) is OutcomeRefusalKind.FORGED
    assert not VERIFIER.trusts(forged)


def test_a_signature_moved_from_another_invocation_is_refused() -> None:
    real = SIGNER.seal(_outcome())
    target = _outcome()  # same tool, tenant, status and result; another call
    moved = _with_data(target, signature=real.data["signature"])
    assert _kind(moved) is OutcomeRefusalKind.MISBOUND


@pytest.mark.parametrize(
    "changes",
    [
        {"status": "error"},
        {"tenant_id": "t_other"},
        {"result": {"message": "rm -rf /"}},
        {"error": {"code": "timeout", "message": "x", "retryable": True}},
        {"documents_accessed": [{"document_id": "d", "version": "1", "access": "read"}]},
        {"agent_did": "did:agent:other"},
    ],
)
def test_any_changed_field_of_a_signed_outcome_is_refused(changes: dict[str, Any]) -> None:
    assert _kind(_with_data(SIGNER.seal(_outcome()), **changes)) is OutcomeRefusalKind.MISBOUND


def test_a_signed_outcome_under_another_type_or_attributes_is_refused() -> None:
    sealed = SIGNER.seal(_outcome())
    as_failed = sealed.model_copy(update={"type": EventType.FAILED})
    assert _kind(as_failed) is OutcomeRefusalKind.MISBOUND
    elsewhere = sealed.model_copy(update={"invocationid": str(uuid.uuid4())})
    assert _kind(elsewhere) is OutcomeRefusalKind.MISBOUND
    other_tenant = sealed.model_copy(update={"tenantid": "t_other"})
    assert _kind(other_tenant) is OutcomeRefusalKind.MISBOUND


@given(data=st.data())
def test_flipping_any_byte_of_the_signature_is_refused(data: st.DataObject) -> None:
    sealed = SIGNER.seal(_outcome(invocation_id=uuid.UUID(int=7)))
    raw = bytearray(sealed.data["signature"].encode())
    index = data.draw(st.integers(0, len(raw) - 1))
    raw[index] ^= data.draw(st.integers(1, 255))
    flipped = _with_data(sealed, signature=raw.decode("latin-1"))
    assert _kind(flipped) in {OutcomeRefusalKind.FORGED, OutcomeRefusalKind.MISBOUND}


def test_every_key_of_a_rotated_key_file_verifies(tmp_path: Path) -> None:
    path = tmp_path / "grant.key"
    path.write_bytes(KEY + b"\n")
    old = OutcomeSigner.from_settings(FleetSettings(grant_key_file=path)).seal(_outcome())
    path.write_bytes(OTHER_KEY + b"\n" + KEY + b"\n")  # rotated: a new key signs first
    rotated = FleetSettings(grant_key_file=path)
    new = OutcomeSigner.from_settings(rotated).seal(_outcome())
    verifier = OutcomeVerifier.from_settings(rotated)
    assert (_kind(old, verifier), _kind(new, verifier)) == (None, None)
    assert _kind(new) is OutcomeRefusalKind.FORGED  # a reader that only knows the old key


def test_sealing_replaces_a_copied_signature_and_leaves_other_events_alone() -> None:
    first = SIGNER.seal(_outcome())
    copy = _with_data(_outcome(), signature=first.data["signature"])  # policy's duplicate
    assert _kind(SIGNER.seal(copy)) is None
    notice = new_event(
        event_type=EventType.INVOKED,
        source=Source.EXECUTOR,
        data={},
        tenant_id="t",
        invocation_id=None,
    )
    assert SIGNER.seal(notice) is notice
    assert VERIFIER.refusal(notice) is None


@pytest.mark.parametrize("mode", list(ContentMode))
def test_a_signature_survives_the_wire(mode: ContentMode) -> None:
    lone = "\udc80"
    result = {
        "big": 2**70,
        "float": 0.1,
        "text": "żółw ☃",
        "lone": lone,
        "nested": [{"b": 1, "a": None}],
    }
    sealed = SIGNER.seal(_outcome(result=result))
    wire = encode(sealed, mode)
    received = decode(key=wire.key, value=wire.value, headers=wire.headers)
    assert _kind(received) is None


def test_screen_keeps_trusted_events_and_audits_the_rest() -> None:
    good, bad = SIGNER.seal(_outcome()), _outcome()
    notice = new_event(
        event_type=EventType.INVOKED,
        source=Source.EXECUTOR,
        data={},
        tenant_id="t",
        invocation_id=None,
    )
    screened = screen(VERIFIER, [good, bad, notice], Source.STATUS)
    assert screened.trusted == [True, False, True]
    ((topic, refused),) = screened.refusals
    assert (topic, refused.type, refused.source) == (
        TopicName.EVENTS,
        EventType.OUTCOME_REFUSED,
        Source.STATUS,
    )
    data = refused.data_as(OutcomeRefused)
    assert (data.invocation_id, data.refusal, data.refused_event_id) == (
        bad.invocationid,
        OutcomeRefusalKind.UNSIGNED,
        bad.id,
    )
    assert (data.claimed_status, data.refused_by, refused.tenantid) == (
        "success",
        "status",
        "t_acme",
    )
    assert data.reason == "outcome is not signed"


def test_every_service_that_sends_outcomes_signs_them(tmp_path: Path) -> None:
    path = tmp_path / "grant.key"
    path.write_bytes(KEY + b"\n")
    settings = FleetSettings(grant_key_file=path)
    emitters = {
        party.name
        for party in routing.ROUTING
        if party.source is not None
        and any(route.topic is TopicName.RESULTS for route in party.sends)
    }
    assert emitters == {"policy", "executor", "validator"}
    for service in SERVICES:
        seal = _outcome_sealer(settings, service)
        assert (seal is not None) is (service in emitters), service
    assert _outcome_sealer(settings, "audit+status") is None
    seal = _outcome_sealer(settings, "policy+executor")
    assert seal is not None
    assert _kind(seal(_outcome())) is None
