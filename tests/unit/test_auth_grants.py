"""Execution grants: bound to one exact call, short-lived, never a capability token."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet.auth import jws
from toolfleet.auth.grants import (
    TYP,
    GrantKeyError,
    GrantSigner,
    GrantVerifier,
    ensure_grant_key,
    grant_kid,
    load_grant_keys,
    parameters_hash,
    rotate_grant_key,
)
from toolfleet.auth.keys import generate_key_pair
from toolfleet.auth.tokens import TokenIssuer, TokenVerifier
from toolfleet.errors import PermissionDenied
from toolfleet.events.identity import CallRef
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.unit

KEY = b"k" * 32
CALL: dict[str, Any] = {
    "invocation_id": "2f1c3a52-0d7e-4a55-9d55-4c1f0b8e9a01",
    "tenant_id": "t1",
    "agent_did": "did:agent:a",
    "tool_id": "core__echo",
    "tool_version": "1.0.0",
    "parameters": {"message": "héllo", "n": [1, 2.5, None]},
}


def _bound(call: dict[str, Any]) -> dict[str, Any]:
    """``CALL`` as the verifier takes it: the call's identity, then its parameters."""
    ref = CallRef(
        invocation_id=call["invocation_id"],
        tenant_id=call["tenant_id"],
        agent_did=call["agent_did"],
        tool_id=call["tool_id"],
        tool_version=call["tool_version"],
    )
    return {"call": ref, "parameters": call["parameters"]}


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _grant(clock: FakeClock | None = None, key: bytes = KEY, timeout_s: float = 30) -> str:
    signer = GrantSigner(key, margin_s=60, clock=clock or FakeClock())
    return signer.sign(**_bound(CALL), capability_jti="cap-jti-1", timeout_s=timeout_s)


def _verifier(clock: FakeClock | None = None, keys: list[bytes] | None = None) -> GrantVerifier:
    return GrantVerifier(keys or [KEY], clock=clock or FakeClock())


def test_a_grant_verifies_for_exactly_its_call() -> None:
    grant = _grant()
    _verifier().verify(grant, **_bound(CALL))
    decoded = _verifier().decode(grant, **_bound(CALL))
    assert decoded.capability_jti == "cap-jti-1"
    assert decoded.expires_at == 1_700_000_000 + 30 + 1 + 60
    assert decoded.params_sha256 == parameters_hash("core__echo", "1.0.0", CALL["parameters"])
    assert jwt.get_unverified_header(grant)["typ"] == "toolfleet-grant+jwt"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("invocation_id", "00000000-0000-0000-0000-000000000000"),
        ("tenant_id", "t2"),
        ("agent_did", "did:agent:b"),
        ("tool_id", "core__get_current_time"),
        ("tool_version", "1.0.1"),
        ("parameters", {"message": "hello", "n": [1, 2.5, None]}),
        ("parameters", {}),
    ],
)
def test_any_other_call_is_denied(field: str, value: Any) -> None:
    with pytest.raises(PermissionDenied, match="execution grant was issued for"):
        _verifier().verify(_grant(), **_bound({**CALL, field: value}))


@pytest.mark.parametrize("claim", ["invocation_id", "tenant_id", "tool_id", "params_sha256", "exp"])
def test_re_signing_a_changed_claim_without_the_key_is_denied(claim: str) -> None:
    header, payload, signature = _grant().split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims[claim] = 9_999_999_999 if claim == "exp" else "x"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    with pytest.raises(PermissionDenied, match="signature is invalid"):
        _verifier().verify(f"{header}.{forged}.{signature}", **_bound(CALL))


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_flipping_any_byte_is_denied(data: st.DataObject) -> None:
    raw = bytearray(_grant().encode())
    raw[data.draw(st.integers(0, len(raw) - 1))] ^= data.draw(st.integers(1, 255))
    with pytest.raises(PermissionDenied):
        _verifier().verify(raw.decode("latin-1"), **_bound(CALL))


def test_expired_and_future_grants_are_denied() -> None:
    clock = FakeClock()
    grant = _grant(clock)
    later = FakeClock(clock.now + 30 + 1 + 60 + 29)
    _verifier(later).verify(grant, **_bound(CALL))  # within the leeway
    with pytest.raises(PermissionDenied, match="expired"):
        _verifier(FakeClock(clock.now + 30 + 1 + 60 + 31)).verify(grant, **_bound(CALL))
    with pytest.raises(PermissionDenied, match="future"):
        _verifier(FakeClock(clock.now - 120)).verify(grant, **_bound(CALL))


def test_wrong_key_and_other_algorithms_are_denied() -> None:
    with pytest.raises(PermissionDenied, match="unknown key"):
        _verifier(keys=[b"z" * 32]).verify(_grant(), **_bound(CALL))
    header = base64.urlsafe_b64encode(
        json.dumps({"alg": "none", "typ": "toolfleet-grant+jwt"}).encode()
    ).rstrip(b"=")
    payload = _grant().split(".")[1]
    with pytest.raises(PermissionDenied, match="HS256"):
        _verifier().verify(f"{header.decode()}.{payload}.", **_bound(CALL))


def test_grants_and_capability_tokens_do_not_mix() -> None:
    pair = generate_key_pair()
    token = TokenIssuer(pair.private_pem, issuer="i", audience="a").issue(
        tenant_id="t1", agent_did="did:agent:a", tool_id="*"
    )
    with pytest.raises(PermissionDenied, match="HS256"):
        _verifier().verify(token, **_bound(CALL))
    with pytest.raises(PermissionDenied, match="RS256"):
        TokenVerifier([pair.public_pem], issuer="i", audience="a").verify(_grant())
    untyped = jwt.encode({"x": 1}, KEY, algorithm="HS256")
    with pytest.raises(PermissionDenied, match="wrong type"):
        _verifier().verify(untyped, **_bound(CALL))


def test_parameters_hash_is_the_policy_canonicalisation() -> None:
    # Golden digests of policy's approval hash (policy/service.py before the move):
    # approvals parked before an upgrade must still match after it.
    params = {"message": "h\u00e9llo", "n": [1, 2.5, None], "z": {"b": True, "a": "x"}}
    assert parameters_hash("core__echo", "1.0.0", params) == (
        "ffbae92fbb0b4e9765a0e6cd62853d0d8756d71b93e9bc3c885f4a52291db543"
    )
    assert parameters_hash("t", "1", {}) == (
        "c92f3ae4c161eca475601935a91c03bb47d5727f9510da553d9c009fe0fd8ee2"
    )


def test_parameters_hash_ignores_key_order_only() -> None:
    assert parameters_hash("t", "1", {"a": 1, "b": 2}) == parameters_hash(
        "t", "1", {"b": 2, "a": 1}
    )
    assert parameters_hash("t", "1", {"a": 1}) != parameters_hash("t", "1", {"a": "1"})


def test_grant_key_file_rotation_keeps_old_grants_valid(tmp_path: Path) -> None:
    path = tmp_path / "grant.key"
    assert ensure_grant_key(path) is True
    assert ensure_grant_key(path) is False
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    settings_ = FleetSettings(grant_key_file=path, grant_margin_s=10)
    signer = GrantSigner.from_settings(settings_)
    assert signer is not None
    old = signer.sign(**_bound(CALL), capability_jti="j", timeout_s=5)
    rotate_grant_key(path)
    assert len(load_grant_keys(path)) == 2
    verifier = GrantVerifier.from_settings(settings_)
    assert verifier is not None
    verifier.verify(old, **_bound(CALL))
    new_signer = GrantSigner.from_settings(settings_)
    assert new_signer is not None
    verifier.verify(
        new_signer.sign(**_bound(CALL), capability_jti="j", timeout_s=5), **_bound(CALL)
    )
    rotate_grant_key(path, keep=1)
    with pytest.raises(PermissionDenied, match="unknown key"):
        GrantVerifier(load_grant_keys(path)).verify(old, **_bound(CALL))
    # No key is never "no check": both refuse, saying how to create one.
    for build in (GrantSigner.from_settings, GrantVerifier.from_settings):
        with pytest.raises(GrantKeyError, match="toolfleet keys grant"):
            build(FleetSettings())


def test_short_or_missing_grant_keys_are_refused(tmp_path: Path) -> None:
    with pytest.raises(GrantKeyError):
        GrantSigner(b"short")
    path = tmp_path / "grant.key"
    path.write_text("# only a comment\n")
    with pytest.raises(GrantKeyError, match="no key"):
        load_grant_keys(path)
    path.write_text("tooshort\n")
    with pytest.raises(GrantKeyError, match="at least 32"):
        load_grant_keys(path)
    with pytest.raises(GrantKeyError, match="cannot read"):
        load_grant_keys(tmp_path / "missing")


DOCS = {"documents": [{"document_id": "handbook", "version": None}], "source": None}


def test_a_grant_binds_the_calls_document_context() -> None:
    signer = GrantSigner(KEY, margin_s=60, clock=FakeClock())
    verifier = GrantVerifier([KEY], clock=FakeClock())
    with_docs = signer.sign(
        **_bound(CALL), capability_jti="cap-jti-1", timeout_s=30, document_context=DOCS
    )
    verifier.verify(with_docs, **_bound(CALL), document_context=DOCS)
    wider = {"documents": [*DOCS["documents"], {"document_id": "payroll", "version": None}]}
    for other in (wider, None):
        with pytest.raises(PermissionDenied, match="other documents"):
            verifier.verify(with_docs, **_bound(CALL), document_context=other)
    # A grant issued without documents does not let an edited event add some.
    with pytest.raises(PermissionDenied, match="other documents"):
        verifier.verify(_grant(), **_bound(CALL), document_context=DOCS)


def _signed_with_key(claims: dict[str, Any]) -> str:
    """``claims`` signed with the fleet's grant key: a grant only a key holder can make."""
    return jws.HS256Signer(KEY, {"kid": grant_kid(KEY), "typ": TYP}).sign(claims)


def _claims_of(grant: str) -> dict[str, Any]:
    payload = grant.split(".")[1]
    claims: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return claims


def test_a_grant_re_signed_with_the_key_verifies() -> None:
    # The premise of the tests below: the same claims re-signed here pass.
    _verifier().verify(_signed_with_key(_claims_of(_grant())), **_bound(CALL))


@pytest.mark.parametrize(
    ("claim", "value"),
    [
        ("iss", "toolfleet/someone-else"),
        ("aud", "toolfleet/another-service"),
        ("aud", ["toolfleet/executor"]),  # grants name one audience, as a string
    ],
)
def test_a_grant_for_another_issuer_or_audience_is_denied(claim: str, value: Any) -> None:
    claims = {**_claims_of(_grant()), claim: value}
    with pytest.raises(PermissionDenied, match="execution grant is invalid"):
        _verifier().verify(_signed_with_key(claims), **_bound(CALL))


@pytest.mark.parametrize("claim", ["iss", "aud", "iat", "exp", "jti", "tool_version", "cap_jti"])
@pytest.mark.parametrize("absent", [True, False])
def test_a_grant_without_a_required_claim_is_denied(claim: str, absent: bool) -> None:
    claims = _claims_of(_grant())
    if absent:
        del claims[claim]
    else:
        claims[claim] = None
    with pytest.raises(PermissionDenied, match=f"lacks the '{claim}' claim"):
        _verifier().verify(_signed_with_key(claims), **_bound(CALL))


def test_a_signed_payload_that_is_not_a_json_object_is_denied() -> None:
    signer = jws.HS256Signer(KEY, {"kid": grant_kid(KEY), "typ": TYP})
    for payload in (b"[1, 2]", b"not json", b"\xff\xfe"):
        head = signer.sign({}).split(".")[0]
        body = base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
        mac = hmac.new(KEY, f"{head}.{body}".encode(), hashlib.sha256).digest()
        sig = base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
        with pytest.raises(PermissionDenied, match="malformed"):
            _verifier().verify(f"{head}.{body}.{sig}", **_bound(CALL))
