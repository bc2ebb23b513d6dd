"""Signed control decisions: proof that an approve, deny or cancel came from a principal.

``toolfleet.invoke.control`` is a topic anyone with produce rights can write to, so an
``approval.granted`` that only *says* who approved proves nothing. The API (and any
CLI/SDK path holding the fleet's execution-grant key) therefore signs every control
event it produces, after it has checked the caller (an approver of that tenant, not
the requesting agent; or, for a cancel, a principal of the call's own tenant). Policy
refuses a decision whose signature is missing, forged, expired, or issued for other
fields: the call stays pending and the refusal is audited.

Design: a compact JWS in the event's ``data.signature``, **HS256 with a key derived
from the execution-grant key** (``TOOLFLEET_GRANT_KEY_FILE``; see
:mod:`toolfleet.auth.grants` for why HMAC and not the token-signing RSA key). The key is
derived (``HMAC(grant_key, "toolfleet-control-v1")``) so a control signature and an
execution grant can never be mistaken for one another even if a ``typ`` check were
forgotten; the ``kid`` is the grant key's, so rotating the grant key file rotates both.

The claims bind the event's identity fields: invocation id, tenant, action, decider,
issued-at and, for approvals, the parameters hash the approver reviewed. Verification
compares each claim with the event's ``data``, so a signature cannot be moved to another
invocation, tenant, decision or decider.
"""

from __future__ import annotations

import hashlib
import hmac
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from toolfleet.auth import jws
from toolfleet.auth.grants import (
    MIN_KEY_BYTES,
    GrantKeyError,
    fleet_grant_keys,
    grant_kid,
    keys_by_kid,
    load_grant_keys,
)
from toolfleet.errors import InvalidEvent, PermissionDenied
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import ApprovalDecision, CancelRequested
from toolfleet.events.types import EventType
from toolfleet.settings import FleetSettings

TYP = "toolfleet-control+jwt"
ISSUER = "toolfleet/control"
AUDIENCE = "toolfleet/policy"
LEEWAY_S = 30
"""Clock skew tolerated between the signing host and policy."""
DEFAULT_TTL_S = 3600
"""How long a signed decision stays acceptable (a lagging policy still honours it)."""
_DERIVATION = b"toolfleet-control-v1"
_WHAT = "control signature"
_BOUND = ("invocation_id", "tenant_id", "action", "decider")
_REQUIRED = ("iss", "aud", "iat", "exp", "jti", *_BOUND, "params_sha256")


class ControlAction(StrEnum):
    """What a control event asks policy to do."""

    APPROVE = "approve"
    DENY = "deny"
    CANCEL = "cancel"


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlClaims:
    """The identity fields of one control event, as signed and as verified."""

    invocation_id: str
    tenant_id: str
    action: ControlAction
    decider: str
    """Who decided: the token subject of the approver or canceller."""
    parameters_hash: str | None = None
    """Approvals: the ``parameters_hash`` the approver reviewed (``None`` otherwise)."""


_ACTION_OF_TYPE: dict[str, ControlAction] = {
    EventType.APPROVAL_GRANTED: ControlAction.APPROVE,
    EventType.APPROVAL_DENIED: ControlAction.DENY,
    EventType.CANCEL_REQUESTED: ControlAction.CANCEL,
}


def control_claims(event_type: str, data: ApprovalDecision | CancelRequested) -> ControlClaims:
    """The claims a control event of ``event_type`` with ``data`` is signed over.

    Raises:
        InvalidEvent: ``event_type`` is not a control event, or does not fit ``data``.
    """
    action = _ACTION_OF_TYPE.get(event_type)
    if action is None:
        raise InvalidEvent(f"{event_type!r} is not a control event")
    if isinstance(data, CancelRequested):
        if action is not ControlAction.CANCEL:
            raise InvalidEvent("a cancel.requested body under another control type")
        return ControlClaims(
            invocation_id=str(data.invocation_id),
            tenant_id=data.tenant_id,
            action=action,
            decider=data.requested_by,
        )
    if action is ControlAction.CANCEL:
        raise InvalidEvent("an approval decision body under cancel.requested")
    return ControlClaims(
        invocation_id=str(data.invocation_id),
        tenant_id=data.tenant_id,
        action=action,
        decider=data.approver,
        parameters_hash=data.parameters_hash if action is ControlAction.APPROVE else None,
    )


def control_key(grant_key: bytes) -> bytes:
    """The HMAC key control signatures use, derived from one execution-grant key."""
    return hmac.new(grant_key, _DERIVATION, hashlib.sha256).digest()


class ControlSigner:
    """Signs control events (API, CLI, SDK side)."""

    def __init__(
        self,
        grant_key: bytes,
        *,
        ttl_s: int = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if len(grant_key) < MIN_KEY_BYTES:
            raise GrantKeyError(f"a grant key must be at least {MIN_KEY_BYTES} bytes")
        self._key = control_key(grant_key)
        self._kid = grant_kid(grant_key)
        self._ttl_s = ttl_s
        self._clock = clock
        self._signer = jws.HS256Signer(self._key, {"kid": self._kid, "typ": TYP})

    @classmethod
    def from_settings(cls, settings: FleetSettings) -> ControlSigner | None:
        """The signer of ``TOOLFLEET_GRANT_KEY_FILE`` (first key), or ``None`` when unset."""
        if settings.grant_key_file is None:
            return None
        return cls(load_grant_keys(settings.grant_key_file)[0])

    def sign(self, claims: ControlClaims) -> str:
        """A compact JWS binding ``claims``, valid for the signer's TTL."""
        now = int(self._clock())
        payload = {
            "iss": ISSUER,
            "aud": AUDIENCE,
            "iat": now,
            "exp": now + self._ttl_s,
            "jti": str(uuid.uuid4()),
            "invocation_id": claims.invocation_id,
            "tenant_id": claims.tenant_id,
            "action": claims.action.value,
            "decider": claims.decider,
            "params_sha256": claims.parameters_hash,
        }
        return self._signer.sign(payload)


class ControlVerifier:
    """Checks control signatures (policy side) against every configured grant key."""

    def __init__(self, grant_keys: list[bytes], *, clock: Callable[[], float] = time.time) -> None:
        self._keys = keys_by_kid(grant_keys, control_key)
        self._clock = clock

    @classmethod
    def from_settings(cls, settings: FleetSettings) -> ControlVerifier:
        """The verifier of ``TOOLFLEET_GRANT_KEY_FILE``; :class:`GrantKeyError` when it
        is unset (:func:`~toolfleet.auth.grants.fleet_grant_keys`)."""
        return cls(fleet_grant_keys(settings))

    def verify(self, signature: str | None, expected: ControlClaims) -> None:
        """Return when ``signature`` signs exactly ``expected``; else :class:`PermissionDenied`.

        The message says which check failed and never quotes the signature.
        """
        if signature is None:
            raise PermissionDenied("control event is not signed")
        claims = self._claims(signature)
        wanted: dict[str, str] = {
            "invocation_id": expected.invocation_id,
            "tenant_id": expected.tenant_id,
            "action": expected.action.value,
            "decider": expected.decider,
        }
        for name in _BOUND:
            value = claims[name]
            # Identity fields are not secrets (the signature already verified): plain equality.
            if not isinstance(value, str) or value != wanted[name]:
                raise PermissionDenied(f"control signature was issued for another {name}")
        bound = claims["params_sha256"]
        if bound is not None and not isinstance(bound, str):
            raise PermissionDenied("control signature claim 'params_sha256' is malformed")
        if bound != expected.parameters_hash:
            raise PermissionDenied("control signature was issued for other parameters")

    def _claims(self, signature: str) -> dict[str, Any]:
        claims = jws.hs256_claims(
            signature,
            self._keys,
            what=_WHAT,
            typ=TYP,
            issuer=ISSUER,
            audience=AUDIENCE,
            # Present, but null when the decision is not bound to parameters.
            required=[c for c in _REQUIRED if c != "params_sha256"],
            now=self._clock(),
            leeway_s=LEEWAY_S,
        )
        if "params_sha256" not in claims:
            raise PermissionDenied("control signature lacks the 'params_sha256' claim")
        return claims


def is_signed_cancel(verifier: ControlVerifier | None, event: Envelope) -> bool:
    """Whether a ``cancel.requested`` event carries a valid control signature.

    For consumers that act on cancels besides policy (every executor): they ignore an
    untrusted one, and policy, which sees the same event, audits the refusal.

    Raises:
        InvalidEvent: ``event`` is not a well-formed cancel.
    """
    cancel = event.data_as(CancelRequested)
    if verifier is None:
        return False
    try:
        verifier.verify(cancel.signature, control_claims(event.type, cancel))
    except PermissionDenied:
        return False
    return True
