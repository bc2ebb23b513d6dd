"""Strict parsing of compact JWS strings, shared by capability tokens and grants.

Only canonical base64url is accepted (no padding, no non-alphabet characters, no set
unused bits), so a JWS has exactly one spelling and any changed byte is detected
before a signature is even checked. Errors never echo the input.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
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
    raw = segments(jws, what=what)[0]
    try:
        parsed = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise PermissionDenied(f"{what} is malformed") from None
    if not isinstance(parsed, dict):
        raise PermissionDenied(f"{what} is malformed")
    return parsed


def is_number(value: object) -> bool:
    """A JSON number that is not a boolean (time claims)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
