"""Execution grants: policy's signed "this exact call was authorized", checked by the executor.

Policy verifies the agent's capability token and then drops it, so the executor
cannot verify it again. Instead policy mints a short-lived *grant* and the executor
checks it before running anything (defence in depth: an event written straight to
``invoke.authorized`` by anyone but policy does not run).

**A grant is not a capability token.** It authorizes one invocation, with these exact
parameters, for about the tool's timeout; it names the capability token only by
``jti``. It is never accepted where a capability token is expected (different
algorithm, ``typ`` and audience) and never handed to tools or agents.

Design: a compact JWS, **HS256 with a fleet secret** from ``TOOLFLEET_GRANT_KEY_FILE``
(one key per line; the first signs, all verify, so the secret can be rotated). Not
RS256 with the fleet's token-signing key, because:

* policy would then hold the private key that mints capability tokens; a compromised
  policy worker could mint tokens for any tenant. The grant secret only mints grants,
  which are already policy's to give;
* a grant signed by the token key is an RS256 JWS a token verifier might accept one
  day by mistake; a separate HMAC key makes that confusion impossible by construction;
* HMAC costs microseconds per invocation, RSA signing about a millisecond on the hot
  path.

The cost of HMAC is that every executor holds the secret and could mint grants; an
executor runs the tools anyway, so that gives it nothing it did not have.

The parameter hash is :func:`parameters_hash`, the same canonical JSON policy binds
approvals to. A call with a ``document_context`` is bound to it too (``docs_sha256``,
:func:`documents_hash`): the documents a tool may read cannot be widened after policy.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolfleet.auth import jws
from toolfleet.errors import PermissionDenied, ToolfleetError
from toolfleet.events.identity import CallRef
from toolfleet.events.types import DEFAULT_POOL
from toolfleet.settings import FleetSettings

TYP = "toolfleet-grant+jwt"
ISSUER = "toolfleet/policy"
AUDIENCE = "toolfleet/executor"
LEEWAY_S = 30
"""Clock skew tolerated between policy and executor hosts."""
DEFAULT_MARGIN_S = 300
MIN_KEY_BYTES = 32
_WHAT = "execution grant"
_BOUND = ("invocation_id", "tenant_id", "agent_did", "tool_id", "tool_version")
_REQUIRED = ("iss", "aud", "iat", "exp", "jti", *_BOUND, "params_sha256", "cap_jti")


def parameters_hash(tool_id: str, version: str, parameters: dict[str, Any]) -> str:
    """SHA-256 (hex) of the canonical tool, version and parameters a call is bound to.

    Canonical JSON: sorted keys, no whitespace, UTF-8 (not ASCII-escaped; a lone
    surrogate, which JSON input may carry, as its three-byte form). The same function
    binds approvals (policy) and grants (policy and executor).
    """
    canonical = json.dumps(
        {"tool_id": tool_id, "version": version, "parameters": parameters},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def documents_hash(document_context: dict[str, Any]) -> str:
    """SHA-256 (hex) of a call's ``document_context`` (as JSON), canonical as above."""
    canonical = json.dumps(
        document_context, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionGrant:
    """The verified claims of a grant."""

    invocation_id: str
    tenant_id: str
    agent_did: str
    tool_id: str
    tool_version: str
    params_sha256: str
    capability_jti: str
    """``jti`` of the capability token policy verified (re-check revocation with it)."""
    expires_at: int
    filesystem_permissions: tuple[str, ...] = ()
    """The token's paths a sandbox may see (``fs``), as policy verified them."""
    network_permissions: tuple[str, ...] = ()
    """The token's hosts a sandbox may reach through the egress proxy (``net``)."""


class GrantKeyError(ToolfleetError):
    """The grant key file is missing or unusable; the message never shows a key."""


def load_grant_keys(path: Path) -> list[bytes]:
    """The keys of a grant key file: one per non-empty line, ``#`` comments allowed."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GrantKeyError(
            f"cannot read the grant key file {path} ({type(exc).__name__})"
        ) from None
    keys = [
        line.strip().encode()
        for line in text.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    if not keys:
        raise GrantKeyError(f"the grant key file {path} holds no key")
    if any(len(key) < MIN_KEY_BYTES for key in keys):
        raise GrantKeyError(f"every key in {path} must be at least {MIN_KEY_BYTES} bytes")
    return keys


MISSING_GRANT_KEY = (
    "TOOLFLEET_GRANT_KEY_FILE is not set: every call is signed and checked with the "
    "fleet's grant key; create one with `toolfleet keys grant PATH` and set "
    "TOOLFLEET_GRANT_KEY_FILE=PATH (`toolfleet dev` does both)"
)
"""Why a service that needs the grant key refuses to start, and how to fix it (one line)."""


def fleet_grant_keys(settings: FleetSettings) -> list[bytes]:
    """The keys of ``TOOLFLEET_GRANT_KEY_FILE``, first one signing.

    No service runs its checks without them: an unset key is a :class:`GrantKeyError`
    saying how to create one, never a check skipped.
    """
    if settings.grant_key_file is None:
        raise GrantKeyError(MISSING_GRANT_KEY)
    return load_grant_keys(settings.grant_key_file)


def keys_by_kid(
    grant_keys: list[bytes], derive: Callable[[bytes], bytes] = lambda key: key
) -> dict[str, bytes]:
    """Each grant key (or the key ``derive`` makes of it for one purpose) by the grant
    key's ``kid``: what a verifier of grants, control events or outcomes checks against.

    Raises:
        GrantKeyError: no key, or one shorter than :data:`MIN_KEY_BYTES`.
    """
    if not grant_keys or any(len(k) < MIN_KEY_BYTES for k in grant_keys):
        raise GrantKeyError(f"grant keys must be at least {MIN_KEY_BYTES} bytes")
    return {grant_kid(k): derive(k) for k in grant_keys}


def new_grant_key() -> str:
    """A fresh random grant key (256 bits, base64url)."""
    return secrets.token_urlsafe(32)


def ensure_grant_key(path: Path) -> bool:
    """Create the grant key file (mode 600) unless it exists; ``True`` when created."""
    # Imported here: toolfleet.auth.keys loads cryptography (~7 MB), which signing and
    # checking grants (HMAC) never use; only creating or rotating the key file does.
    from toolfleet.auth.keys import write_atomically

    if path.exists():
        return False
    write_atomically(path, (new_grant_key() + "\n").encode(), mode=0o600)
    return True


def rotate_grant_key(path: Path, *, keep: int = 2) -> None:
    """Put a new signing key first, keep up to ``keep`` keys (old grants still verify)."""
    from toolfleet.auth.keys import write_atomically  # see ensure_grant_key

    old = load_grant_keys(path) if path.exists() else []
    keys = [new_grant_key().encode(), *old][: max(1, keep)]
    write_atomically(path, b"\n".join(keys) + b"\n", mode=0o600)


def grant_kid(key: bytes) -> str:
    """Public id of a grant key (a hash; reveals nothing usable about the key)."""
    digest = hashlib.sha256(b"toolfleet-grant-kid\x00" + key).digest()
    return base64.urlsafe_b64encode(digest).decode()[:12]


class GrantSigner:
    """Mints grants (policy side)."""

    def __init__(
        self,
        key: bytes,
        *,
        margin_s: int = DEFAULT_MARGIN_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise GrantKeyError(f"a grant key must be at least {MIN_KEY_BYTES} bytes")
        self._key = key
        self._kid = grant_kid(key)
        self._margin_s = margin_s
        self._clock = clock
        self._signer = jws.HS256Signer(key, {"kid": self._kid, "typ": TYP})

    @classmethod
    def from_settings(cls, settings: FleetSettings) -> GrantSigner:
        """The signer of ``TOOLFLEET_GRANT_KEY_FILE`` (first key); :class:`GrantKeyError`
        when it is unset (:func:`fleet_grant_keys`)."""
        return cls(fleet_grant_keys(settings)[0], margin_s=settings.grant_margin_s)

    def sign(
        self,
        *,
        call: CallRef,
        parameters: dict[str, Any],
        capability_jti: str,
        timeout_s: float,
        document_context: dict[str, Any] | None = None,
        filesystem_permissions: Sequence[str] = (),
        network_permissions: Sequence[str] = (),
        pool: str = DEFAULT_POOL,
    ) -> str:
        """A grant for this call, valid for ``timeout_s`` plus the margin; the token's
        filesystem and network permissions ride along, so the executor's sandbox can
        trust them. ``pool``: the executor pool the call was authorized for (a claim
        only when not the default one)."""
        invocation_id, tenant_id, agent_did = call.invocation_id, call.tenant_id, call.agent_did
        tool_id, tool_version = call.tool_id, call.tool_version or ""
        now = int(self._clock())
        claims = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "iat": now,
            "exp": now + int(timeout_s) + 1 + self._margin_s,
            "jti": str(uuid.uuid4()),
            "invocation_id": invocation_id,
            "tenant_id": tenant_id,
            "agent_did": agent_did,
            "tool_id": tool_id,
            "tool_version": tool_version,
            "params_sha256": parameters_hash(tool_id, tool_version, parameters),
            "cap_jti": capability_jti,
        }
        if document_context is not None:
            claims["docs_sha256"] = documents_hash(document_context)
        if filesystem_permissions:
            claims["fs"] = list(filesystem_permissions)
        if network_permissions:
            claims["net"] = list(network_permissions)
        if pool != DEFAULT_POOL:
            claims["pool"] = pool
        return self._signer.sign(claims)


class GrantVerifier:
    """Checks grants (executor side) against every configured grant key."""

    def __init__(self, keys: list[bytes], *, clock: Callable[[], float] = time.time) -> None:
        self._keys = keys_by_kid(keys)
        self._clock = clock

    @classmethod
    def from_settings(cls, settings: FleetSettings) -> GrantVerifier:
        """The verifier of ``TOOLFLEET_GRANT_KEY_FILE``; :class:`GrantKeyError` when it
        is unset (:func:`fleet_grant_keys`)."""
        return cls(fleet_grant_keys(settings))

    def verify(
        self,
        grant: str,
        *,
        call: CallRef,
        parameters: dict[str, Any],
        document_context: dict[str, Any] | None = None,
        pool: str = DEFAULT_POOL,
    ) -> None:
        """Return when ``grant`` authorizes exactly this call; else :class:`PermissionDenied`."""
        self.decode(
            grant, call=call, parameters=parameters, document_context=document_context, pool=pool
        )

    def decode(
        self,
        grant: str,
        *,
        call: CallRef,
        parameters: dict[str, Any],
        document_context: dict[str, Any] | None = None,
        pool: str = DEFAULT_POOL,
    ) -> ExecutionGrant:
        """:meth:`verify`, returning the grant's claims (``capability_jti`` ...). ``pool``:
        the pool the authorized event names, which must be the one policy granted."""
        claims = self._claims(grant)
        invocation_id, tenant_id, agent_did = call.invocation_id, call.tenant_id, call.agent_did
        tool_id, tool_version = call.tool_id, call.tool_version or ""
        expected = {
            "invocation_id": invocation_id,
            "tenant_id": tenant_id,
            "agent_did": agent_did,
            "tool_id": tool_id,
            "tool_version": tool_version,
        }
        for name in _BOUND:
            if not isinstance(claims[name], str) or claims[name] != expected[name]:
                raise PermissionDenied(f"execution grant was issued for another {name}")
        digest = parameters_hash(tool_id, tool_version, parameters)
        bound = claims["params_sha256"]
        if not isinstance(bound, str) or not hmac.compare_digest(bound, digest):
            raise PermissionDenied("execution grant was issued for other parameters")
        docs = claims.get("docs_sha256")
        wanted = None if document_context is None else documents_hash(document_context)
        if not (docs is None and wanted is None) and not (
            isinstance(docs, str) and wanted is not None and hmac.compare_digest(docs, wanted)
        ):
            raise PermissionDenied("execution grant was issued for other documents")
        if claims.get("pool", DEFAULT_POOL) != pool:
            raise PermissionDenied("execution grant was issued for another pool")
        if not isinstance(claims["cap_jti"], str):
            raise PermissionDenied("execution grant claim 'cap_jti' is malformed")
        network = claims.get("net", [])
        if not isinstance(network, list) or not all(isinstance(n, str) for n in network):
            raise PermissionDenied("execution grant claim 'net' is malformed")
        return ExecutionGrant(
            invocation_id=invocation_id,
            tenant_id=tenant_id,
            agent_did=agent_did,
            tool_id=tool_id,
            tool_version=tool_version,
            params_sha256=digest,
            capability_jti=claims["cap_jti"],
            expires_at=int(claims["exp"]),
            filesystem_permissions=_texts(claims, "fs"),
            network_permissions=tuple(network),
        )

    def _claims(self, grant: str) -> dict[str, Any]:
        return jws.hs256_claims(
            grant,
            self._keys,
            what=_WHAT,
            typ=TYP,
            issuer=ISSUER,
            audience=AUDIENCE,
            required=_REQUIRED,
            now=self._clock(),
            leeway_s=LEEWAY_S,
        )


def _texts(claims: dict[str, Any], name: str) -> tuple[str, ...]:
    value = claims.get(name, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PermissionDenied(f"execution grant claim {name!r} is malformed")
    return tuple(value)
