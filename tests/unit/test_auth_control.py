"""Control signatures: an approve, deny or cancel verifies only for exactly its fields."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet.auth.control import (
    ControlAction,
    ControlClaims,
    ControlSigner,
    ControlVerifier,
    control_claims,
)
from toolfleet.auth.grants import (
    GrantKeyError,
    GrantSigner,
    GrantVerifier,
    ensure_grant_key,
    rotate_grant_key,
)
from toolfleet.errors import InvalidEvent, PermissionDenied
from toolfleet.events.identity import CallRef
from toolfleet.events.models import ApprovalDecision, CancelRequested
from toolfleet.events.types import EventType
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.unit

KEY = b"k" * 32
OTHER_KEY = b"o" * 32
HASH = "a" * 64
CLAIMS = ControlClaims(
    invocation_id="2f1c3a52-0d7e-4a55-9d55-4c1f0b8e9a01",
    tenant_id="t1",
    action=ControlAction.APPROVE,
    decider="did:user:alice",
    parameters_hash=HASH,
)


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _sign(claims: ControlClaims = CLAIMS, key: bytes = KEY, clock: FakeClock | None = None) -> str:
    return ControlSigner(key, ttl_s=600, clock=clock or FakeClock()).sign(claims)


def _verifier(keys: list[bytes] | None = None, clock: FakeClock | None = None) -> ControlVerifier:
    return ControlVerifier(keys or [KEY], clock=clock or FakeClock())


def test_a_signature_verifies_for_exactly_its_fields() -> None:
    signature = _sign()
    _verifier().verify(signature, CLAIMS)
    changes: dict[str, Any] = {
        "invocation_id": str(uuid.uuid4()),
        "tenant_id": "t2",
        "action": ControlAction.DENY,
        "decider": "did:agent:requester",
        "parameters_hash": "b" * 64,
    }
    for field, value in changes.items():
        other = dataclasses.replace(CLAIMS, **{field: value})
        with pytest.raises(PermissionDenied):
            _verifier().verify(signature, other)
    with pytest.raises(PermissionDenied, match="other parameters"):
        _verifier().verify(signature, dataclasses.replace(CLAIMS, parameters_hash=None))


def test_unsigned_forged_and_foreign_signatures_are_refused() -> None:
    with pytest.raises(PermissionDenied, match="not signed"):
        _verifier().verify(None, CLAIMS)
    with pytest.raises(PermissionDenied, match="unknown key"):
        _verifier().verify(_sign(key=OTHER_KEY), CLAIMS)
    # Right kid, wrong key: what someone who guessed the header would produce.
    header = jwt.get_unverified_header(_sign())
    payload = jwt.decode(_sign(), options={"verify_signature": False})
    forged = jwt.encode(payload, OTHER_KEY, algorithm="HS256", headers=header)
    with pytest.raises(PermissionDenied, match="invalid"):
        _verifier().verify(forged, CLAIMS)
    # The raw grant key (not the derived control key) does not sign control events.
    raw = jwt.encode(payload, KEY, algorithm="HS256", headers=header)
    with pytest.raises(PermissionDenied, match="invalid"):
        _verifier().verify(raw, CLAIMS)
    with pytest.raises(PermissionDenied, match="malformed"):
        _verifier().verify("not.a.jws", CLAIMS)
    with pytest.raises(PermissionDenied, match="not HS256"):
        _verifier().verify(jwt.encode(payload, "", algorithm="none"), CLAIMS)


def test_grants_and_control_signatures_are_not_interchangeable() -> None:
    grant = GrantSigner(KEY, clock=FakeClock()).sign(
        call=CallRef(
            invocation_id=CLAIMS.invocation_id,
            tenant_id="t1",
            agent_did="did:user:alice",
            tool_id="core__echo",
            tool_version="1.0.0",
        ),
        parameters={},
        capability_jti="j",
        timeout_s=30,
    )
    with pytest.raises(PermissionDenied, match="wrong type"):
        _verifier().verify(grant, CLAIMS)
    with pytest.raises(PermissionDenied, match="wrong type"):
        GrantVerifier([KEY], clock=FakeClock()).verify(
            _sign(),
            call=CallRef(
                invocation_id=CLAIMS.invocation_id,
                tenant_id="t1",
                agent_did="did:user:alice",
                tool_id="core__echo",
                tool_version="1.0.0",
            ),
            parameters={},
        )


def test_signatures_expire_and_cannot_come_from_the_future() -> None:
    clock = FakeClock()
    signature = _sign(clock=clock)
    later = FakeClock(clock.now + 600 + 30)
    with pytest.raises(PermissionDenied, match="expired"):
        _verifier(clock=later).verify(signature, CLAIMS)
    _verifier(clock=FakeClock(clock.now + 600)).verify(signature, CLAIMS)
    earlier = FakeClock(clock.now - 31)
    with pytest.raises(PermissionDenied, match="future"):
        _verifier(clock=earlier).verify(signature, CLAIMS)


def test_a_rotated_grant_key_file_still_verifies_old_signatures(tmp_path: Path) -> None:
    path = tmp_path / "grant.key"
    ensure_grant_key(path)
    fleet = FleetSettings(grant_key_file=path)
    signer = ControlSigner.from_settings(fleet)
    assert signer is not None
    old = signer.sign(CLAIMS)
    rotate_grant_key(path)
    verifier = ControlVerifier.from_settings(fleet)
    assert verifier is not None
    verifier.verify(old, CLAIMS)
    new_signer = ControlSigner.from_settings(fleet)
    assert new_signer is not None
    verifier.verify(new_signer.sign(CLAIMS), CLAIMS)
    assert ControlSigner.from_settings(FleetSettings()) is None
    with pytest.raises(GrantKeyError, match="toolfleet keys grant"):
        ControlVerifier.from_settings(FleetSettings())


def test_control_claims_follow_the_event_type() -> None:
    invocation = uuid.UUID(CLAIMS.invocation_id)
    decision = ApprovalDecision(
        invocation_id=invocation, tenant_id="t1", approver="did:user:bob", parameters_hash=HASH
    )
    approve = control_claims(EventType.APPROVAL_GRANTED, decision)
    assert approve.action is ControlAction.APPROVE
    assert approve.decider == "did:user:bob"
    assert approve.parameters_hash == HASH
    deny = control_claims(EventType.APPROVAL_DENIED, decision)
    assert deny.action is ControlAction.DENY
    assert deny.parameters_hash is None
    cancel = CancelRequested(invocation_id=invocation, tenant_id="t1", requested_by="did:x")
    claims = control_claims(EventType.CANCEL_REQUESTED, cancel)
    assert (claims.action, claims.decider, claims.parameters_hash) == (
        ControlAction.CANCEL,
        "did:x",
        None,
    )
    with pytest.raises(InvalidEvent):
        control_claims(EventType.APPROVAL_GRANTED, cancel)
    with pytest.raises(InvalidEvent):
        control_claims(EventType.CANCEL_REQUESTED, decision)
    with pytest.raises(InvalidEvent):
        control_claims(EventType.INVOKE_REQUESTED, decision)


_TEXT = st.text(min_size=1, max_size=40)


@settings(max_examples=50, deadline=None)
@given(tenant=_TEXT, decider=st.text(max_size=40), action=st.sampled_from(list(ControlAction)))
def test_any_fields_round_trip_and_bind(tenant: str, decider: str, action: ControlAction) -> None:
    claims = ControlClaims(
        invocation_id=CLAIMS.invocation_id, tenant_id=tenant, action=action, decider=decider
    )
    signature = _sign(claims)
    _verifier().verify(signature, claims)
    with pytest.raises(PermissionDenied):
        _verifier().verify(signature, dataclasses.replace(claims, decider=decider + "x"))


_DROP = object()


def _resigned(**changes: Any) -> str:
    """``_sign()``'s claims changed and signed again with the control key itself: what only
    a key holder can make, so every check after the signature's must refuse it."""
    signer = ControlSigner(KEY, ttl_s=600, clock=FakeClock())
    payload = jwt.decode(_sign(), options={"verify_signature": False})
    for name, value in changes.items():
        if value is _DROP:
            del payload[name]
        else:
            payload[name] = value
    header = jwt.get_unverified_header(_sign())
    return jwt.encode(payload, signer._key, algorithm="HS256", headers=header)


def test_a_key_holders_signature_must_still_name_policy_and_every_claim() -> None:
    _verifier().verify(_resigned(), CLAIMS)  # the premise: re-signed as is, it verifies
    for changes in (
        {"aud": "toolfleet/executor"},
        {"iss": "someone"},
        {"aud": ["toolfleet/policy"]},
    ):
        with pytest.raises(PermissionDenied, match="control signature is invalid"):
            _verifier().verify(_resigned(**changes), CLAIMS)
    for name in ("jti", "exp", "decider", "params_sha256"):
        with pytest.raises(PermissionDenied, match=f"lacks the '{name}' claim"):
            _verifier().verify(_resigned(**{name: _DROP}), CLAIMS)
    with pytest.raises(PermissionDenied, match="lacks the 'jti' claim"):
        _verifier().verify(_resigned(jti=None), CLAIMS)
    # A decision not bound to parameters carries the claim as null.
    unbound = dataclasses.replace(CLAIMS, parameters_hash=None)
    _verifier().verify(_resigned(params_sha256=None), unbound)
