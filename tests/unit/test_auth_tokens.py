"""Capability token verification: every check, and tampering of any kind is denied."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet.auth.keys import generate_key_pair, key_id
from toolfleet.auth.tokens import REQUIRED_CLAIMS, TokenIssuer, TokenVerifier
from toolfleet.errors import PermissionDenied

pytestmark = pytest.mark.unit

PAIR = generate_key_pair()
OTHER = generate_key_pair()
ISS, AUD = "iss-test", "aud-test"
ISSUER = TokenIssuer(PAIR.private_pem, issuer=ISS, audience=AUD)
VERIFIER = TokenVerifier([PAIR.public_pem], issuer=ISS, audience=AUD)
TOKEN = ISSUER.issue(tenant_id="t1", agent_did="did:agent:a", tool_id="core__*")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {
        "iss": ISS,
        "aud": AUD,
        "sub": "did:agent:a",
        "iat": now,
        "exp": now + 600,
        "jti": "jti-1",
        "tenant_id": "t1",
        "agent_did": "did:agent:a",
        "tool_id": "core__echo",
        "tool_version": "^1.0.0",
    }
    claims.update(changes)
    return {k: v for k, v in claims.items() if v is not None}


def _sign(claims: dict[str, Any], *, pem: bytes = PAIR.private_pem, kid: str | None = None) -> str:
    headers = {"kid": kid if kid is not None else PAIR.kid}
    return jwt.encode(claims, pem, algorithm="RS256", headers=headers)


def _denied(token: str, verifier: TokenVerifier = VERIFIER) -> str:
    with pytest.raises(PermissionDenied) as caught:
        verifier.verify(token)
    message = caught.value.message
    assert len(token) < 8 or token not in message
    return message


def test_issued_token_verifies_with_typed_claims() -> None:
    issued = ISSUER.mint(
        tenant_id="t1",
        agent_did="did:agent:a",
        tool_id="core__echo",
        tool_version="^1.0.0",
        ttl_s=120,
        connections=["conn-gh", "conn-slack"],
        network_permissions=["api.github.com"],
    )
    cap = VERIFIER.verify(issued.token)
    assert (cap.tenant_id, cap.agent_did, cap.tool_id, cap.tool_version) == (
        "t1",
        "did:agent:a",
        "core__echo",
        "^1.0.0",
    )
    assert cap.jti == issued.jti
    assert cap.expires_at == issued.expires_at == cap.issued_at + 120
    assert cap.connections == ("conn-gh", "conn-slack")
    assert cap.allows_connection("conn-gh")
    assert not cap.allows_connection("conn-x")
    assert cap.network_permissions == ("api.github.com",)
    assert cap.allowed_operations == ("invoke",)
    assert cap.allows_operation("invoke")
    assert (cap.issuer, cap.audience) == (ISS, AUD)
    assert jwt.get_unverified_header(issued.token)["kid"] == PAIR.kid == issued.kid


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_flipping_any_byte_is_denied(data: st.DataObject) -> None:
    raw = bytearray(TOKEN.encode())
    index = data.draw(st.integers(0, len(raw) - 1))
    raw[index] ^= data.draw(st.integers(1, 255))
    _denied(raw.decode("latin-1"))


def test_non_canonical_base64_is_denied() -> None:
    header, payload, signature = TOKEN.split(".")
    # The last character of the 342-char signature carries 2 bits and 4 unused ones.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    last = alphabet.index(signature[-1])
    sibling = alphabet[last ^ 1]
    assert base64.urlsafe_b64decode(signature[:-1] + sibling + "==") == base64.urlsafe_b64decode(
        signature + "=="
    )
    assert _denied(f"{header}.{payload}.{signature[:-1]}{sibling}") == (
        "capability token is malformed"
    )
    assert _denied(f"{header}.{payload}.{signature}==") == "capability token is malformed"


def test_alg_none_is_denied() -> None:
    header = _b64(json.dumps({"alg": "none", "typ": "JWT", "kid": PAIR.kid}).encode())
    token = f"{header}.{_b64(json.dumps(_claims()).encode())}."
    assert "RS256" in _denied(token)


def test_hs256_signed_with_the_public_key_is_denied() -> None:
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": PAIR.kid}).encode())
    payload = _b64(json.dumps(_claims()).encode())
    mac = hmac.new(PAIR.public_pem, f"{header}.{payload}".encode(), hashlib.sha256).digest()
    assert "RS256" in _denied(f"{header}.{payload}.{_b64(mac)}")


def test_es256_is_denied() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    token = jwt.encode(_claims(), key, algorithm="ES256", headers={"kid": PAIR.kid})
    assert "RS256" in _denied(token)


def test_wrong_key_with_the_fleet_kid_is_denied() -> None:
    token = _sign(_claims(), pem=OTHER.private_pem, kid=PAIR.kid)
    assert _denied(token) == "capability token signature is invalid"


def test_unknown_kid_is_denied() -> None:
    token = _sign(_claims(), pem=OTHER.private_pem, kid=OTHER.kid)
    assert _denied(token) == "capability token is signed by an unknown key"


def test_single_key_accepts_a_token_without_kid_but_two_keys_do_not() -> None:
    token = jwt.encode(_claims(), PAIR.private_pem, algorithm="RS256")
    assert VERIFIER.verify(token).tenant_id == "t1"
    two = TokenVerifier([PAIR.public_pem, OTHER.public_pem], issuer=ISS, audience=AUD)
    assert _denied(token, two) == "capability token is signed by an unknown key"


def test_expiry_with_leeway() -> None:
    now = int(time.time())
    assert VERIFIER.verify(_sign(_claims(exp=now - 10))).tenant_id == "t1"
    assert _denied(_sign(_claims(exp=now - 31, iat=now - 100))) == "capability token has expired"


def test_iat_in_the_future_is_denied() -> None:
    now = int(time.time())
    assert VERIFIER.verify(_sign(_claims(iat=now + 10))).tenant_id == "t1"
    assert "future" in _denied(_sign(_claims(iat=now + 120)))


def test_nbf_in_the_future_is_denied() -> None:
    assert "nbf" in _denied(_sign(_claims(nbf=int(time.time()) + 120)))


def test_verifier_clock_is_used() -> None:
    late = TokenVerifier([PAIR.public_pem], issuer=ISS, audience=AUD, clock=lambda: 2e10)
    assert _denied(TOKEN, late) == "capability token has expired"


@pytest.mark.parametrize(
    ("claims", "message"),
    [
        (_claims(iss="someone-else"), "capability token issuer does not match"),
        (_claims(aud="another-service"), "capability token audience does not match"),
        (_claims(aud=["x", "y"]), "capability token audience does not match"),
    ],
)
def test_wrong_issuer_or_audience_is_denied(claims: dict[str, Any], message: str) -> None:
    assert _denied(_sign(claims)) == message


def test_audience_list_containing_ours_is_accepted() -> None:
    assert VERIFIER.verify(_sign(_claims(aud=["x", AUD]))).audience == AUD


@pytest.mark.parametrize("claim", REQUIRED_CLAIMS)
def test_missing_required_claim_is_denied(claim: str) -> None:
    claims = _claims()
    del claims[claim]
    assert _denied(_sign(claims)) == f"capability token lacks the {claim!r} claim"


@pytest.mark.parametrize(
    "changes",
    [
        {"tenant_id": ""},
        {"tenant_id": 7},
        {"agent_did": ["x"]},
        {"jti": ""},
        {"connections": "conn"},
        {"allowed_operations": [1]},
        {"exp": "soon"},
        {"iat": True},
    ],
)
def test_malformed_claims_are_denied(changes: dict[str, Any]) -> None:
    message = _denied(_sign(_claims(**changes)))
    assert "claim" in message or "malformed" in message or "invalid" in message


def test_crit_header_is_denied() -> None:
    token = jwt.encode(
        _claims(), PAIR.private_pem, algorithm="RS256", headers={"kid": PAIR.kid, "crit": ["b64"]}
    )
    assert "critical" in _denied(token)


@pytest.mark.parametrize("garbage", ["", "abc", "a.b", "a.b.c.d", "é.é.é", "x" * 20_000])
def test_garbage_is_malformed(garbage: str) -> None:
    assert _denied(garbage) == "capability token is malformed"


def test_key_ids_match_between_pem_and_private_key() -> None:
    assert ISSUER.kid == key_id(PAIR.public_pem) == PAIR.kid


def test_a_verified_token_is_not_verified_twice_but_still_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [time.time()]
    verifier = TokenVerifier([PAIR.public_pem], issuer=ISS, audience=AUD, clock=lambda: now[0])
    token = _sign(_claims(exp=int(now[0]) + 60))
    decodes: list[str] = []
    real_decode = jwt.decode

    def counting_decode(*args: Any, **kwargs: Any) -> Any:
        decodes.append("decode")
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(jwt, "decode", counting_decode)
    first = verifier.verify(token)
    assert verifier.verify(token) == first
    assert decodes == ["decode"]  # one signature check for both calls
    now[0] += 91  # past exp and its 30 s leeway
    assert "expired" in _denied(token, verifier)


def test_a_forged_twin_of_a_verified_token_is_still_denied() -> None:
    verifier = TokenVerifier([PAIR.public_pem], issuer=ISS, audience=AUD)
    token = _sign(_claims())
    verifier.verify(token)
    head, body, sig = token.split(".")
    forged = f"{head}.{body}.{sig[:-2]}{'A' if sig[-2] != 'A' else 'B'}{sig[-1]}"
    _denied(forged, verifier)


def test_cache_size_zero_verifies_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    verifier = TokenVerifier([PAIR.public_pem], issuer=ISS, audience=AUD, cache_size=0)
    token = _sign(_claims())
    calls: list[int] = []
    real_decode = jwt.decode
    monkeypatch.setattr(jwt, "decode", lambda *a, **k: calls.append(1) or real_decode(*a, **k))
    verifier.verify(token)
    verifier.verify(token)
    assert len(calls) == 2
