"""Strict parsing of compact JWS strings, shared by capability tokens and grants.

Only canonical base64url is accepted (no padding, no non-alphabet characters, no set
unused bits), so a JWS has exactly one spelling and any changed byte is detected
before a signature is even checked. Errors never echo the input.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple

from toolfleet.errors import PermissionDenied

HS256: Final = "HS256"
"""The one algorithm of toolfleet's own JWS (grants, control signatures)."""
MAX_JWS_CHARS = 16_384
"""Longer strings are refused before any parsing."""
_COMPACT = re.compile(r"[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*")
_TO_STANDARD = bytes.maketrans(b"-_", b"+/")


def segments(jws: object, *, what: str) -> list[bytes]:
    """The decoded header, payload and signature, or :class:`PermissionDenied`."""
    malformed = PermissionDenied(f"{what} is malformed")
    if not isinstance(jws, str) or not jws or len(jws) > MAX_JWS_CHARS:
        raise malformed
    if _COMPACT.fullmatch(jws) is None:  # three segments, base64url alphabet only
        raise malformed
    decoded = []
    # ASCII only now; in the standard alphabet, which binascii decodes and encodes.
    for part in jws.encode("ascii").translate(_TO_STANDARD).split(b"."):
        padded = part + b"=" * (-len(part) % 4)
        try:
            raw = binascii.a2b_base64(padded)
        except (binascii.Error, ValueError):
            raise malformed from None
        # Canonical only: otherwise unused trailing bits give a second string that
        # verifies as the same token (a length of 1 mod 4 never encodes either).
        if binascii.b2a_base64(raw, newline=False) != padded:
            raise malformed
        decoded.append(raw)
    return decoded


def header(jws: object, *, what: str) -> dict[str, Any]:
    """The JOSE header of a canonical compact JWS (unverified)."""
    return _json_object(segments(jws, what=what)[0], what=what)


def _json_object(raw: bytes, *, what: str) -> dict[str, Any]:
    try:
        parsed = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise PermissionDenied(f"{what} is malformed") from None
    if not isinstance(parsed, dict):
        raise PermissionDenied(f"{what} is malformed")
    return parsed


def hs256_claims(
    token: object,
    keys: Mapping[str, bytes],
    *,
    what: str,
    typ: str,
    issuer: str,
    audience: str,
    required: Sequence[str],
    now: float,
    leeway_s: float,
) -> dict[str, Any]:
    """The claims of a toolfleet HS256 JWS (grants, control signatures), all checked.

    The header must name HS256, ``typ`` and a ``kid`` of ``keys`` (and no ``crit``); the
    signature must verify with that key; every ``required`` claim
    must be present and not null (as PyJWT's ``require``); ``iss`` and ``aud`` must be
    exactly ``issuer`` and ``audience`` (one string: toolfleet signs no list); ``exp``
    and ``iat`` numbers, not expired nor issued in the future beyond ``leeway_s``.
    """

    def key_of(header: dict[str, Any]) -> bytes:
        if header.get("alg") != HS256:
            raise PermissionDenied(f"{what} is not {HS256}-signed")
        if header.get("typ") != typ:
            raise PermissionDenied(f"{what} has the wrong type")
        if "crit" in header:
            raise PermissionDenied(f"{what} has critical header parameters")
        kid = header.get("kid")
        key = keys.get(kid) if isinstance(kid, str) else None
        if key is None:
            raise PermissionDenied(f"{what} is signed by an unknown key")
        return key

    claims = _verified_payload(token, key_of, what=what)
    missing = next((name for name in required if claims.get(name) is None), None)
    if missing is not None:
        raise PermissionDenied(f"{what} lacks the {missing!r} claim")
    if claims.get("iss") != issuer or claims.get("aud") != audience:
        raise PermissionDenied(f"{what} is invalid")
    exp: Any = claims.get("exp")
    iat: Any = claims.get("iat")
    if not (is_number(exp) and is_number(iat)):
        raise PermissionDenied(f"{what} time claims must be numbers")
    if exp + leeway_s <= now:
        raise PermissionDenied(f"{what} has expired")
    if iat - leeway_s > now:
        raise PermissionDenied(f"{what} was issued in the future (iat)")
    return claims


class Signed(NamedTuple):
    """A canonical compact JWS taken apart, its signature not yet checked (a tuple: one
    is built per grant an executor or validator checks)."""

    header: dict[str, Any]
    """The JOSE header (parsed; a JSON object)."""
    signing_input: bytes
    """What the signature covers: the first two segments as written, ASCII."""
    signature: bytes
    raw_payload: bytes
    """The decoded payload, unparsed: read it only once the signature verified."""

    def payload(self, *, what: str) -> dict[str, Any]:
        """The payload as a JSON object, or :class:`PermissionDenied` (malformed)."""
        return _json_object(self.raw_payload, what=what)


def signed(jws: object, *, what: str) -> Signed:
    """``jws`` taken apart (:func:`segments`), its header parsed, or :class:`PermissionDenied`.

    Headers with ``b64`` other than true (RFC 7797's unencoded payload) are refused: every
    payload here is base64url JSON, and a header that says otherwise is malformed.
    """
    raw_header, raw_payload, signature = segments(jws, what=what)
    header = _json_object(raw_header, what=what)
    if header.get("b64", True) is not True:
        raise PermissionDenied(f"{what} is malformed")
    assert isinstance(jws, str)  # segments() refused anything else
    signing_input = jws[: jws.rindex(".")].encode("ascii")  # base64url: ASCII only
    return Signed(header, signing_input, signature, raw_payload)


def _verified_payload(
    jws: object, key_of: Callable[[dict[str, Any]], bytes], *, what: str
) -> dict[str, Any]:
    """The payload of a canonical compact JWS whose HMAC-SHA256 signature verifies.

    ``key_of`` gets the (unverified) header and returns the key, or raises
    :class:`PermissionDenied`. The signature is compared in constant time over the exact
    signing input; nothing of the payload is parsed before it verified.
    """
    parts = signed(jws, what=what)
    expected = hmac.digest(key_of(parts.header), parts.signing_input, "sha256")
    if not hmac.compare_digest(expected, parts.signature):
        raise PermissionDenied(f"{what}: signature is invalid")
    return parts.payload(what=what)


class CompactSigner:
    """Signs compact JWS as ``jwt.encode`` does: the same bytes as PyJWT (header keys
    sorted, compact JSON, unpadded base64url), the header segment encoded once.

    ``sign_bytes`` turns a signing input into its signature (HMAC, RSA ...).
    """

    def __init__(
        self, alg: str, headers: Mapping[str, Any], sign_bytes: Callable[[bytes], bytes]
    ) -> None:
        header = {"typ": "JWT", "alg": alg, **headers}
        self._header = _b64(json.dumps(header, separators=(",", ":"), sort_keys=True).encode())
        self._sign_bytes = sign_bytes

    def sign(self, claims: Mapping[str, Any]) -> str:
        """The compact JWS of ``claims`` (JSON-serializable, keys in the given order)."""
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        signing_input = self._header + b"." + payload
        return (signing_input + b"." + _b64(self._sign_bytes(signing_input))).decode()


class HS256Signer(CompactSigner):
    """Signs compact JWS with HMAC-SHA256, as ``jwt.encode(..., algorithm="HS256")`` does,
    without its per-call key preparation: the keyed hash is prepared once (grants are
    minted per call, and PyJWT's ``encode`` cost more than the rest of authorizing one).
    """

    def __init__(self, key: bytes, headers: Mapping[str, Any]) -> None:
        self._mac = hmac.new(key, digestmod=hashlib.sha256)
        super().__init__(HS256, headers, self._mac_of)

    def _mac_of(self, signing_input: bytes) -> bytes:
        mac = self._mac.copy()
        mac.update(signing_input)
        return mac.digest()


def _b64(raw: bytes) -> bytes:
    return base64.urlsafe_b64encode(raw).rstrip(b"=")


def is_number(value: object) -> bool:
    """A JSON number that is not a boolean (time claims)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
