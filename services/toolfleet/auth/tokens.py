"""Capability tokens: RS256 JWTs naming tenant, agent, tool and what the agent may do.

Verification is strict and boring on purpose:

* the token must be compact JWS with canonical base64url segments (no padding, no
  ignored bits), so no two strings verify as the same token;
* the algorithm is pinned to RS256, never read from the token (``none``, HS256 with
  the public key as a secret, ES256 ... are refused), and a ``crit`` header is refused;
* the key is chosen by ``kid`` from a :class:`~toolfleet.auth.keyring.KeyRing` (JWKS
  file or URL, or PEM file), so old and new keys both verify during a rollover;
  ``jku``/``jwk``/``x5u`` headers are ignored, keys only ever come from configuration;
* ``exp``, ``iat``, ``iss``, ``aud``, ``jti``, ``tenant_id``, ``agent_did`` and
  ``tool_id`` are required; ``exp``/``nbf``/``iat`` are checked with a 30 s leeway.

Every failure is a :class:`~toolfleet.errors.PermissionDenied` whose message says
which check failed and never contains the token or anything copied from it.
:meth:`TokenVerifier.verify` does no I/O; key refreshes happen in the async
:meth:`TokenVerifier.refresh` / :meth:`TokenVerifier.verify_fresh`. Revocation (by
``jti``) is checked separately, see :mod:`toolfleet.storage.revocation`.

An agent sends the same token with every call, and an RS256 signature check is the
largest cost of authorizing one (``bench/PROFILE.md``), so a verifier remembers the
tokens it verified, by SHA-256 of the whole string, until they expire: a hit skips the
signature and claim parsing but not the time checks, and holds only while the key that
verified it is still in the ring (a key dropped by rotation takes its tokens with it).
Revocation is not cached: callers still ask per call.

Tokens are signed and verified with cryptography's RSA (PKCS #1 v1.5, SHA-256) over
:mod:`~toolfleet.auth.jws`'s strict parsing, not with PyJWT, whose only part left here
was that call and three claim checks: PyJWT parsed the token a second time and loaded
its algorithms module (cryptography's x509, Ed448, X25519, ML-DSA and ML-KEM too). A
verification now takes 48 us rather than 96 and a policy worker 1.2 MB less memory
(issue 36). Tokens are byte for byte what ``jwt.encode`` writes, and
``tests/unit/test_auth_tokens.py`` holds the verifier to ``jwt.decode``: whatever it
accepts PyJWT accepts with the same claims.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.hashes import SHA256

from toolfleet.auth import jws
from toolfleet.auth.capability import LEEWAY_S as LEEWAY_S  # re-exported
from toolfleet.auth.capability import Capability as Capability  # re-exported
from toolfleet.auth.keyring import FileKeySource, KeyRing, UrlJwksSource
from toolfleet.auth.keys import kid_of, load_rsa_private_key
from toolfleet.errors import PermissionDenied
from toolfleet.settings import FleetSettings

ALGORITHM = "RS256"
REQUIRED_CLAIMS = ("exp", "iat", "iss", "aud", "jti", "tenant_id", "agent_did", "tool_id")
WHAT = "capability token"
VERIFIED_CACHE_SIZE = 4096
"""Verified tokens a verifier remembers (least recently used dropped first)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class IssuedToken:
    """A freshly signed token and the facts an operator needs to revoke it."""

    token: str = field(repr=False)
    jti: str
    expires_at: int
    kid: str


class TokenIssuer:
    """Signs capability tokens with the fleet's current private key."""

    def __init__(
        self,
        private_pem: bytes,
        public_pem: bytes | None = None,
        *,
        issuer: str,
        audience: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # The kid comes from the private key: after a rotation the public file holds
        # several keys, and only the private key says which one signs.
        del public_pem
        self._private = load_rsa_private_key(private_pem)
        self._kid = kid_of(self._private.public_key())
        self._signer = jws.CompactSigner(ALGORITHM, {"kid": self._kid}, self._rs256)
        self._issuer = issuer
        self._audience = audience
        self._clock = clock

    @classmethod
    def from_files(
        cls, private: Path, public: Path | None = None, *, issuer: str, audience: str
    ) -> TokenIssuer:
        return cls(private.read_bytes(), issuer=issuer, audience=audience)

    @property
    def kid(self) -> str:
        """The ``kid`` new tokens carry."""
        return self._kid

    def mint(
        self,
        *,
        tenant_id: str,
        agent_did: str,
        tool_id: str = "*",
        tool_version: str = "*",
        ttl_s: int = 3600,
        scopes: list[str] | None = None,
        allowed_operations: list[str] | None = None,
        filesystem_permissions: list[str] | None = None,
        network_permissions: list[str] | None = None,
        credential_permissions: list[str] | None = None,
        connections: list[str] | None = None,
    ) -> IssuedToken:
        """Sign a token; returns it with its ``jti`` and ``exp``."""
        now = int(self._clock())
        jti = str(uuid.uuid4())
        claims = {
            "iss": self._issuer,
            "aud": self._audience,
            "sub": agent_did,
            "iat": now,
            "nbf": now - 1,
            "exp": now + ttl_s,
            "jti": jti,
            "tenant_id": tenant_id,
            "agent_did": agent_did,
            "tool_id": tool_id,
            "tool_version": tool_version,
            "allowed_operations": allowed_operations or ["invoke"],
            "filesystem_permissions": filesystem_permissions or [],
            "network_permissions": network_permissions or [],
            "credential_permissions": credential_permissions or [],
            "connections": connections or [],
            "scope": " ".join(scopes or []),
        }
        token = self._signer.sign(claims)
        return IssuedToken(token=token, jti=jti, expires_at=now + ttl_s, kid=self._kid)

    def _rs256(self, signing_input: bytes) -> bytes:
        return self._private.sign(signing_input, padding.PKCS1v15(), SHA256())

    def issue(self, **options: Any) -> str:
        """Sign a token (the options of :meth:`mint`); returns the compact JWS alone."""
        return self.mint(**options).token


class TokenVerifier:
    """Verifies capability tokens against a key ring (old and new keys during rotation)."""

    def __init__(
        self,
        keys: list[bytes] | KeyRing,
        *,
        issuer: str,
        audience: str,
        leeway_s: int = LEEWAY_S,
        clock: Callable[[], float] = time.time,
        cache_size: int = VERIFIED_CACHE_SIZE,
    ) -> None:
        """``cache_size``: verified tokens remembered (0: verify every signature)."""
        self._ring = keys if isinstance(keys, KeyRing) else KeyRing.from_pems(keys)
        self._issuer = issuer
        self._audience = audience
        self._leeway_s = leeway_s
        self._clock = clock
        self._cache_size = cache_size
        self._verified: OrderedDict[bytes, _Verified] = OrderedDict()

    @classmethod
    def from_file(cls, path: Path, *, issuer: str, audience: str) -> TokenVerifier:
        """Keys from a PEM file (several keys allowed), reloaded on :meth:`refresh`."""
        ring = KeyRing.from_file(FileKeySource(path=path, format="pem"))
        return cls(ring, issuer=issuer, audience=audience)

    @classmethod
    def from_settings(cls, settings: FleetSettings) -> TokenVerifier | None:
        """The verifier the settings describe, or ``None`` when no key is configured.

        ``TOOLFLEET_JWKS_FILE`` wins, then ``TOOLFLEET_JWKS_URL`` (loaded on the first
        :meth:`refresh`: call ``await verifier.refresh(strict=True)`` at start-up), then
        ``TOOLFLEET_JWT_PUBLIC_KEY_FILE``. File keys are read now, so a missing or bad
        file fails here with a :class:`~toolfleet.auth.keyring.KeySourceError`.
        """
        refresh_s = settings.jwks_refresh_s
        if settings.jwks_file is not None:
            source = FileKeySource(path=settings.jwks_file, format="jwks")
            ring = KeyRing.from_file(source, refresh_s=refresh_s)
        elif settings.jwks_url is not None:
            ring = KeyRing(source=UrlJwksSource(url=settings.jwks_url), refresh_s=refresh_s)
        elif settings.jwt_public_key_file is not None:
            source = FileKeySource(path=settings.jwt_public_key_file, format="pem")
            ring = KeyRing.from_file(source, refresh_s=refresh_s)
        else:
            return None
        return cls(ring, issuer=settings.jwt_issuer, audience=settings.jwt_audience)

    @property
    def keys(self) -> KeyRing:
        return self._ring

    async def refresh(self, *, force: bool = False, strict: bool = False) -> bool:
        """Reload the keys when the refresh interval has passed (see :meth:`KeyRing.refresh`)."""
        return await self._ring.refresh(force=force, strict=strict)

    async def refresh_for(self, token: str) -> None:
        """Before :meth:`verify`: reload keys if the token's ``kid`` is unknown or keys are stale.

        Never raises for a bad token; :meth:`verify` reports that.
        """
        kid = _unverified_kid(token)
        if kid is None:
            await self._ring.refresh()
        else:
            await self._ring.refresh_for_kid(kid)

    async def verify_fresh(self, token: str) -> Capability:
        """:meth:`refresh_for` then :meth:`verify`: what an async service should call.

        A token verified before needs no ``kid`` lookup: the periodic refresh is
        enough, and :meth:`verify` then finds it in the cache if its key stayed."""
        digest = _digest(token)
        if digest in self._verified:
            await self._ring.refresh()
        else:
            await self.refresh_for(token)
        return self._verify(token, digest)

    def verify(self, token: str) -> Capability:
        """The token's capability, or :class:`PermissionDenied` naming the failed check."""
        return self._verify(token, _digest(token))

    def _verify(self, token: str, digest: bytes) -> Capability:
        hit = self._verified.get(digest)
        if hit is not None:
            current = self._ring.get(hit.kid) if hit.kid is not None else self._ring.only_key()
            if current is hit.key:
                self._check_times(hit.capability.claims)
                self._verified.move_to_end(digest)
                return hit.capability
            del self._verified[digest]  # its key left the ring: verify from scratch
        parts = jws.signed(token, what=WHAT)
        header = parts.header
        if header.get("alg") != ALGORITHM:
            raise PermissionDenied(f"capability token is not signed with {ALGORITHM}")
        if "crit" in header:
            raise PermissionDenied("capability token has critical header parameters")
        key = self._key_for(header)
        if not rs256_valid(key, parts.signing_input, parts.signature):
            raise PermissionDenied("capability token signature is invalid")
        claims = parts.payload(what=WHAT)
        self._check_claims(claims)
        self._check_times(claims)
        capability = _capability(claims, audience=self._audience)
        if self._cache_size > 0:
            kid = header.get("kid")
            self._verified[digest] = _Verified(
                capability=capability, key=key, kid=kid if isinstance(kid, str) else None
            )
            if len(self._verified) > self._cache_size:
                self._verified.popitem(last=False)
        return capability

    def _key_for(self, header: dict[str, Any]) -> rsa.RSAPublicKey:
        if "kid" not in header:
            key = self._ring.only_key()
        else:  # a kid that is not a string (null too) names no key
            kid = header["kid"]
            key = self._ring.get(kid) if isinstance(kid, str) else None
        if key is None:
            if not self._ring.kids:
                raise PermissionDenied("no token verification key is loaded")
            raise PermissionDenied("capability token is signed by an unknown key")
        return key

    def _check_claims(self, claims: dict[str, Any]) -> None:
        """Required claims present and not null, ``iss`` ours, ``aud`` ours or a list
        holding ours: what ``jwt.decode`` checked with ``require``, ``issuer`` and
        ``audience`` (times are checked by :meth:`_check_times`, with this verifier's
        clock and leeway)."""
        missing = next((name for name in REQUIRED_CLAIMS if claims.get(name) is None), None)
        if missing is not None:
            raise PermissionDenied(f"capability token lacks the {missing!r} claim")
        audience = claims["aud"]
        audiences = [audience] if isinstance(audience, str) else audience
        if (
            not isinstance(audiences, list)
            or not all(isinstance(a, str) for a in audiences)
            or self._audience not in audiences
        ):
            raise PermissionDenied("capability token audience does not match")
        if claims["iss"] != self._issuer:
            raise PermissionDenied("capability token issuer does not match")

    def _check_times(self, claims: dict[str, Any]) -> None:
        now = self._clock()
        exp, iat, nbf = claims["exp"], claims["iat"], claims.get("nbf", 0)
        if not all(jws.is_number(v) for v in (exp, iat, nbf)):
            raise PermissionDenied("capability token time claims must be numbers")
        if exp + self._leeway_s <= now:
            raise PermissionDenied("capability token has expired")
        if iat - self._leeway_s > now:
            raise PermissionDenied("capability token was issued in the future (iat)")
        if nbf - self._leeway_s > now:
            raise PermissionDenied("capability token is not valid yet (nbf)")


@dataclass(frozen=True, slots=True, kw_only=True)
class _Verified:
    """A token that passed every check but the clock, and the key that verified it."""

    capability: Capability
    key: rsa.RSAPublicKey
    kid: str | None


def rs256_valid(key: rsa.RSAPublicKey, signing_input: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is ``key``'s RS256 (PKCS #1 v1.5, SHA-256) over ``signing_input``."""
    try:
        key.verify(signature, signing_input, padding.PKCS1v15(), SHA256())
    except InvalidSignature:
        return False
    return True


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def _capability(claims: dict[str, Any], *, audience: str) -> Capability:
    agent_did = _text(claims, "agent_did")
    return Capability(
        tenant_id=_text(claims, "tenant_id"),
        agent_did=agent_did,
        tool_id=_text(claims, "tool_id"),
        tool_version=_text(claims, "tool_version", default="*"),
        jti=_text(claims, "jti"),
        subject=_text(claims, "sub", default=agent_did),
        scopes=frozenset(_text(claims, "scope", default="", empty=True).split()),
        allowed_operations=_texts(claims, "allowed_operations", default=("invoke",)),
        filesystem_permissions=_texts(claims, "filesystem_permissions"),
        network_permissions=_texts(claims, "network_permissions"),
        credential_permissions=_texts(claims, "credential_permissions"),
        connections=_texts(claims, "connections"),
        issuer=str(claims["iss"]),
        audience=audience,
        issued_at=int(claims["iat"]),
        expires_at=int(claims["exp"]),
        claims=claims,
    )


def _text(
    claims: dict[str, Any], name: str, *, default: str | None = None, empty: bool = False
) -> str:
    value = claims.get(name, default)
    if not isinstance(value, str) or (not value and not empty) or len(value) > 1024:
        raise PermissionDenied(f"capability token claim {name!r} is malformed")
    return value


def _texts(claims: dict[str, Any], name: str, *, default: tuple[str, ...] = ()) -> tuple[str, ...]:
    value = claims.get(name)
    if value is None:
        return default
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PermissionDenied(f"capability token claim {name!r} must be a list of strings")
    return tuple(value)


def _unverified_kid(token: str) -> str | None:
    try:
        kid = jws.header(token, what=WHAT).get("kid")
    except PermissionDenied:
        return None
    return kid if isinstance(kid, str) and len(kid) <= 256 else None


async def open_verifier(settings: FleetSettings) -> TokenVerifier | None:
    """:meth:`TokenVerifier.from_settings` with its keys loaded (fails fast at start-up).

    Raises :class:`~toolfleet.auth.keyring.KeySourceError` when the configured keys
    cannot be loaded; returns ``None`` when no key is configured at all.
    """
    verifier = TokenVerifier.from_settings(settings)
    if verifier is not None and not verifier.keys.kids:
        await verifier.refresh(force=True, strict=True)
    return verifier
