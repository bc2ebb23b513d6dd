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
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet.auth import tokens
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


def _forge(header: dict[str, Any], claims: dict[str, Any]) -> str:
    """A compact JWS signed with the fleet's key, its header as given (PyJWT's ``encode``
    refuses some headers a hostile client may write)."""
    signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
    key = serialization.load_pem_private_key(PAIR.private_pem, password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64(signature)}"


def _count_signature_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    checks: list[int] = []
    real = tokens.rs256_valid

    def counting(*args: Any) -> bool:
        checks.append(1)
        return real(*args)

    monkeypatch.setattr(tokens, "rs256_valid", counting)
    return checks


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


def test_an_unencoded_payload_header_is_malformed() -> None:
    """RFC 7797's ``b64: false`` (without ``crit``, which is refused on its own): the
    payload is always base64url JSON here."""
    for b64 in (False, 0, "false", None):
        token = _forge({"alg": "RS256", "kid": PAIR.kid, "b64": b64}, _claims())
        assert _denied(token) == "capability token is malformed"
    assert VERIFIER.verify(_forge({"alg": "RS256", "kid": PAIR.kid, "b64": True}, _claims()))


def test_issued_tokens_are_what_pyjwt_writes_and_reads() -> None:
    """Same bytes as ``jwt.encode`` with the same claims, header and key, and
    ``jwt.decode`` reads the same claims back (PKCS #1 v1.5 signatures are
    deterministic)."""
    issued = ISSUER.mint(tenant_id="t1", agent_did="did:agent:a", tool_id="core__*", ttl_s=60)
    claims = jwt.decode(
        issued.token, PAIR.public_pem, algorithms=["RS256"], audience=AUD, issuer=ISS
    )
    assert issued.token == jwt.encode(
        claims, PAIR.private_pem, algorithm="RS256", headers={"kid": PAIR.kid, "typ": "JWT"}
    )
    assert VERIFIER.verify(issued.token).claims == claims


def _pyjwt_claims(token: str) -> dict[str, Any] | None:
    """What PyJWT makes of ``token`` with the verifier's settings, or None if it refuses."""
    try:
        claims: dict[str, Any] = jwt.decode(
            token,
            PAIR.public_pem,
            algorithms=["RS256"],
            audience=AUD,
            issuer=ISS,
            options={"require": list(REQUIRED_CLAIMS)},
            leeway=30,
        )
    except jwt.PyJWTError:
        return None
    return claims


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(
    changes=st.dictionaries(
        st.sampled_from([*REQUIRED_CLAIMS, "sub", "nbf", "scope", "tool_version", "x"]),
        _JSON | st.just(AUD) | st.just([AUD, "x"]) | st.just(ISS),
        max_size=3,
    ),
    headers=st.dictionaries(
        st.sampled_from(["kid", "b64", "typ", "x5u", "jku"]), _JSON, max_size=2
    ),
)
def test_what_the_verifier_accepts_pyjwt_accepts_with_the_same_claims(
    changes: dict[str, Any], headers: dict[str, Any]
) -> None:
    """Claims and headers of any shape, signed with the fleet's key: whatever the
    verifier accepts, PyJWT (the library it replaced) accepts too and reads the same
    claims; what PyJWT refuses, the verifier refuses."""
    token = _forge({"alg": "RS256", "kid": PAIR.kid, **headers}, _claims(**changes))
    theirs = _pyjwt_claims(token)
    try:
        ours = VERIFIER.verify(token).claims
    except PermissionDenied:
        ours = None
    if ours is not None:
        assert theirs == ours
    if theirs is None:
        assert ours is None


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
    checks = _count_signature_checks(monkeypatch)
    first = verifier.verify(token)
    assert verifier.verify(token) == first
    assert checks == [1]  # one signature check for both calls
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
    checks = _count_signature_checks(monkeypatch)
    verifier.verify(token)
    verifier.verify(token)
    assert checks == [1, 1]
