"""JSON Web Key Sets (RFC 7517) of the RSA keys that verify capability tokens.

Only what toolfleet needs: RSA signature keys for RS256. Keys of another type, use or
algorithm are skipped (a JWKS may legitimately publish them for other consumers);
a malformed RSA entry makes the whole document invalid, so a typo never silently
drops the key a fleet depends on.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric import rsa

from toolfleet.auth.keys import MIN_RSA_BITS, kid_of, load_rsa_public_key

ALGORITHM = "RS256"
MAX_JWKS_BYTES = 1_048_576
"""Larger JWKS documents are refused (a key set is a few kilobytes)."""


class JwksError(ValueError):
    """A JWKS document that cannot be used; the message says why (never key material)."""


def public_jwk(key: rsa.RSAPublicKey | bytes, *, kid: str | None = None) -> dict[str, str]:
    """The JWK of an RSA public key (or its PEM), with ``kid``, ``use=sig``, ``alg=RS256``."""
    public = load_rsa_public_key(key) if isinstance(key, bytes) else key
    numbers = public.public_numbers()
    return {
        "kty": "RSA",
        "use": "sig",
        "alg": ALGORITHM,
        "kid": kid or kid_of(public),
        "n": _b64_uint(numbers.n),
        "e": _b64_uint(numbers.e),
    }


def jwks_document(keys: Mapping[str, rsa.RSAPublicKey]) -> dict[str, list[dict[str, str]]]:
    """A JWKS holding ``keys`` (by ``kid``), in order."""
    return {"keys": [public_jwk(key, kid=kid) for kid, key in keys.items()]}


def dump_jwks(keys: Mapping[str, rsa.RSAPublicKey]) -> bytes:
    """:func:`jwks_document` as pretty JSON bytes, ready to write to a file."""
    return (json.dumps(jwks_document(keys), indent=2) + "\n").encode()


def parse_jwks(data: bytes | str) -> dict[str, rsa.RSAPublicKey]:
    """The RS256 signature keys of a JWKS document, by ``kid``, in document order."""
    if len(data) > MAX_JWKS_BYTES:
        raise JwksError("JWKS document is too large")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise JwksError("JWKS document is not JSON") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise JwksError('JWKS document must be an object with a "keys" array')
    keys: dict[str, rsa.RSAPublicKey] = {}
    for index, jwk in enumerate(doc["keys"]):
        if not isinstance(jwk, dict):
            raise JwksError(f"JWKS key #{index} is not an object")
        if not _is_rs256_signing_key(jwk):
            continue
        key = _rsa_key(jwk, index)
        kid = jwk.get("kid")
        if kid is not None and (not isinstance(kid, str) or not kid):
            raise JwksError(f"JWKS key #{index} has an invalid kid")
        keys[kid or kid_of(key)] = key
    return keys


def _is_rs256_signing_key(jwk: dict[str, Any]) -> bool:
    return (
        jwk.get("kty") == "RSA"
        and jwk.get("use", "sig") == "sig"
        and jwk.get("alg", ALGORITHM) == ALGORITHM
    )


def _rsa_key(jwk: dict[str, Any], index: int) -> rsa.RSAPublicKey:
    try:
        n, e = _uint(jwk["n"]), _uint(jwk["e"])
        key = rsa.RSAPublicNumbers(e, n).public_key()
    except (KeyError, TypeError, ValueError):
        raise JwksError(f"JWKS key #{index} is not a valid RSA public key") from None
    if key.key_size < MIN_RSA_BITS:
        raise JwksError(f"JWKS key #{index} is shorter than {MIN_RSA_BITS} bits")
    return key


def _b64_uint(value: int) -> str:
    raw = value.to_bytes((value.bit_length() + 7) // 8 or 1, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _uint(text: object) -> int:
    if not isinstance(text, str) or not text:
        raise ValueError("not a base64url string")
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    return int.from_bytes(raw, "big")
