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
from collections.abc import Callable
from typing import Any

from toolfleet.errors import PermissionDenied

MAX_JWS_CHARS = 16_384
"""Longer strings are refused before any parsing."""
_B64URL = re.compile(r"[A-Za-z0-9_-]*")


def segments(jws: object, *, what: str) -> list[bytes]:
    """The decoded header, payload and signature, or :class:`PermissionDenied`."""
    malformed = PermissionDenied(f"{what} is malformed")
    if not isinstance(jws, str) or not jws or len(jws) > MAX_JWS_CHARS:
        raise malformed
    parts = jws.split(".")
    if len(parts) != 3 or not all(_B64URL.fullmatch(p) for p in parts):
        raise malformed
    decoded = []
    for part in parts:
        try:
            raw = base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
        except (binascii.Error, ValueError):
            raise malformed from None
        # Canonical only: otherwise unused trailing bits give a second string that
        # verifies as the same token.
        if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != part:
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


class HS256Verified:
    """A compact JWS whose HMAC-SHA256 signature was checked: its header and claims."""

    __slots__ = ("claims", "header")

    def __init__(self, header: dict[str, Any], claims: dict[str, Any]) -> None:
        self.header = header
        self.claims = claims


def verify_hs256(
    jws: object, key_of: Callable[[dict[str, Any]], bytes], *, what: str
) -> HS256Verified:
    """Check the HMAC-SHA256 signature of a canonical compact JWS and parse its claims.

    ``key_of`` gets the (unverified) header and returns the key, or raises
    :class:`PermissionDenied` (an unknown ``kid``, a header it refuses). The signature
    is compared in constant time over the exact signing input; nothing of the payload
    is parsed before it verified. Claims are not checked here (issuer, audience, times:
    the caller's), only that the payload is a JSON object.
    """
    raw_header, raw_payload, signature = segments(jws, what=what)
    head = _json_object(raw_header, what=what)
    key = key_of(head)
    assert isinstance(jws, str)  # segments() refused anything else
    signing_input = jws[: jws.rindex(".")].encode("ascii")  # base64url: ASCII only
    expected = hmac.new(key, signing_input, hashlib.sha256).digest()
    if not hmac.compare_digest(expected, signature):
        raise PermissionDenied(f"{what} signature is invalid")
    return HS256Verified(head, _json_object(raw_payload, what=what))


class HS256Signer:
    """Signs compact JWS with HMAC-SHA256, as ``jwt.encode(..., algorithm="HS256")`` does.

    Same bytes as PyJWT (header keys sorted, compact JSON, unpadded base64url), without
    its per-call key preparation: the header segment and the keyed hash are prepared
    once (grants are minted per call, and PyJWT's ``encode`` cost more than the rest
    of authorizing one).
    """

    def __init__(self, key: bytes, headers: dict[str, Any]) -> None:
        header = {"typ": "JWT", "alg": "HS256", **headers}
        self._header = _b64(json.dumps(header, separators=(",", ":"), sort_keys=True).encode())
        self._mac = hmac.new(key, digestmod=hashlib.sha256)

    def sign(self, claims: dict[str, Any]) -> str:
        """The compact JWS of ``claims`` (JSON-serializable, keys in the given order)."""
        payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
        signing_input = self._header + b"." + payload
        mac = self._mac.copy()
        mac.update(signing_input)
        return (signing_input + b"." + _b64(mac.digest())).decode()


def _b64(raw: bytes) -> bytes:
    return base64.urlsafe_b64encode(raw).rstrip(b"=")


def is_number(value: object) -> bool:
    """A JSON number that is not a boolean (time claims)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
