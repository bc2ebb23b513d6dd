"""Signed outcomes: proof that a terminal event on ``invoke.results`` came from the fleet.

``toolfleet.invoke.results`` is a topic anyone with produce rights can write to, so an
``ai.agent.tool.succeeded`` that only *says* it ended a call proves nothing: status would
show it, policy would hand it to duplicates waiting on the call's idempotency key, and a
client would return it. Every service that ends calls (policy, executor, validator)
therefore signs each outcome as it is sent (:meth:`OutcomeSigner.seal`, the producer's
``before_send`` hook, so no emitter can forget), and every reader that acts on outcomes
(status, policy's idempotency waiters, ``toolfleet.client``) drops one without a valid
signature, counts it and has it audited (``ai.agent.tool.outcome.refused``).

Design: the compact JWS of control events (:mod:`toolfleet.auth.control`), **HS256 with a
key derived from the execution-grant key** (``HMAC(grant_key, "toolfleet-outcome-v1")``),
its own ``typ``, issuer and audience, so an outcome signature, a control signature and an
execution grant can never stand for one another. The ``kid`` is the grant key's:
rotating the grant key file rotates this key too, and every key of the file verifies.

The claims bind the outcome's ``invocation_id``, ``tenant_id``, event ``type``,
``status`` and ``result_sha256``: SHA-256 of the canonical JSON of the outcome's whole
``data`` except ``signature``. So the error (its code, its ``retryable``), the result,
the metadata and the documents read are all bound, not only ``result``: a signed failure
cannot be turned into another failure, nor a signed outcome moved to another call,
tenant, type or status. The hash is over the JSON the wire carries (the event's
``data``), not a model, so a reader with an older or newer model checks the same bytes.

An outcome is a fact that does not go stale, so the signature is valid for a long time
(:data:`VALID_S`, longer than any retention of the results topic): a status rebuilt from
the topic still accepts every outcome on it. Replaying a signed outcome re-states what
the fleet said about that very call, which changes nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from toolfleet.auth import jws
from toolfleet.auth.grants import (
    MIN_KEY_BYTES,
    GrantKeyError,
    fleet_grant_keys,
    grant_kid,
    keys_by_kid,
)
from toolfleet.errors import PermissionDenied
from toolfleet.events.envelope import Emitted, Envelope
from toolfleet.events.models import OutcomeRefusalKind
from toolfleet.events.outcomes import refused_outcome_event
from toolfleet.events.types import TERMINAL_TYPES, Source
from toolfleet.observability.metrics import OUTCOMES_REFUSED
from toolfleet.settings import FleetSettings

TYP: Final = "toolfleet-outcome+jwt"
ISSUER: Final = "toolfleet/fleet"
AUDIENCE: Final = "toolfleet/results"
LEEWAY_S: Final = 30
"""Clock skew tolerated between the signing service and a reader."""
VALID_S: Final = 366 * 24 * 3600
"""How long a signature stays acceptable: longer than any results topic keeps a record."""
SIGNATURE_FIELD: Final = "signature"
"""The member of an outcome's ``data`` that carries its signature."""
_DERIVATION: Final = b"toolfleet-outcome-v1"
_WHAT: Final = "outcome signature"
_BOUND: Final = ("invocation_id", "tenant_id", "type", "status", "result_sha256")
_REQUIRED: Final = ("iss", "aud", "iat", "exp", *_BOUND)


@dataclass(frozen=True, slots=True, kw_only=True)
class OutcomeRefusal:
    """Why one outcome is not trusted."""

    kind: OutcomeRefusalKind
    reason: str
    """Which check failed; never quotes the signature."""


def outcome_key(grant_key: bytes) -> bytes:
    """The HMAC key outcome signatures use, derived from one execution-grant key."""
    return hmac.new(grant_key, _DERIVATION, hashlib.sha256).digest()


def body_hash(data: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of an outcome's ``data`` without its signature, as canonical JSON.

    Canonical as :func:`~toolfleet.auth.grants.parameters_hash`: sorted keys, no
    whitespace, UTF-8 (a lone surrogate as its three-byte form).
    """
    body = {k: v for k, v in data.items() if k != SIGNATURE_FIELD}
    try:
        text = _canonical(body)
    except TypeError:
        # Keys JSON turns into strings (an int key beside str keys cannot be sorted):
        # hash what the wire carries, keys as text.
        text = _canonical(json.loads(json.dumps(body)))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _bound(event: Envelope) -> dict[str, str]:
    """The claims ``event`` is (to be) signed over; wrongly typed fields count as absent."""
    data = event.data
    return {
        "invocation_id": _text(data.get("invocation_id")),
        "tenant_id": _text(data.get("tenant_id")),
        "type": event.type,
        "status": _text(data.get("status")),
        "result_sha256": body_hash(data),
    }


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


class OutcomeSigner:
    """Signs the outcomes a service sends (policy, executor, validator)."""

    def __init__(self, grant_key: bytes, *, clock: Callable[[], float] = time.time) -> None:
        if len(grant_key) < MIN_KEY_BYTES:
            raise GrantKeyError(f"a grant key must be at least {MIN_KEY_BYTES} bytes")
        self._clock = clock
        self._signer = jws.HS256Signer(
            outcome_key(grant_key), {"kid": grant_kid(grant_key), "typ": TYP}
        )

    @classmethod
    def from_settings(cls, settings: FleetSettings) -> OutcomeSigner:
        """The signer of ``TOOLFLEET_GRANT_KEY_FILE`` (first key); :class:`GrantKeyError`
        when it is unset."""
        return cls(fleet_grant_keys(settings)[0])

    def sign(self, event: Envelope) -> str:
        """The signature of the outcome ``event`` (its ``data`` as it is, minus any
        signature)."""
        now = int(self._clock())
        return self._signer.sign(
            {"iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + VALID_S, **_bound(event)}
        )

    def seal(self, event: Envelope) -> Envelope:
        """``event`` with a fresh signature when it is an outcome, else ``event`` itself.

        Any signature it carried is replaced: a copy of another call's outcome (policy's
        answer to a duplicate) is signed for its own invocation.
        """
        if event.type not in TERMINAL_TYPES:
            return event
        data = {k: v for k, v in event.data.items() if k != SIGNATURE_FIELD}
        unsigned = event.model_copy(update={"data": data})
        return event.model_copy(update={"data": {**data, SIGNATURE_FIELD: self.sign(unsigned)}})


class OutcomeVerifier:
    """Checks outcome signatures against every key of the grant key file."""

    def __init__(self, grant_keys: list[bytes], *, clock: Callable[[], float] = time.time) -> None:
        self._keys = keys_by_kid(grant_keys, outcome_key)
        self._clock = clock

    @classmethod
    def from_settings(cls, settings: FleetSettings) -> OutcomeVerifier:
        """The verifier of ``TOOLFLEET_GRANT_KEY_FILE``; :class:`GrantKeyError` when it
        is unset: a reader without the key would have to trust every outcome."""
        return cls(fleet_grant_keys(settings))

    def refusal(self, event: Envelope) -> OutcomeRefusal | None:
        """``None`` when the outcome ``event`` is signed by the fleet for exactly what it
        says; else why it must be ignored. Non-terminal events are not judged here."""
        if event.type not in TERMINAL_TYPES:
            return None
        signature = event.data.get(SIGNATURE_FIELD)
        if signature is None:
            return OutcomeRefusal(kind=OutcomeRefusalKind.UNSIGNED, reason="outcome is not signed")
        try:
            claims = jws.hs256_claims(
                signature,
                self._keys,
                what=_WHAT,
                typ=TYP,
                issuer=ISSUER,
                audience=AUDIENCE,
                required=_REQUIRED,
                now=self._clock(),
                leeway_s=LEEWAY_S,
            )
        except PermissionDenied as exc:
            return OutcomeRefusal(kind=OutcomeRefusalKind.FORGED, reason=exc.message)
        expected = _bound(event)
        for name in _BOUND:
            value = claims[name]
            # Not secrets (the signature already verified): plain equality.
            if not isinstance(value, str) or value != expected[name]:
                return _misbound(f"outcome signature was issued for another {name}")
        # The attributes readers may key on must name the call the signature binds.
        if event.invocationid not in (None, expected["invocation_id"]):
            return _misbound("outcome names another invocation than its data")
        if event.tenantid not in (None, expected["tenant_id"]):
            return _misbound("outcome names another tenant than its data")
        return None

    def trusts(self, event: Envelope) -> bool:
        """Whether ``event`` is not an outcome, or a validly signed one."""
        return self.refusal(event) is None


def _misbound(reason: str) -> OutcomeRefusal:
    return OutcomeRefusal(kind=OutcomeRefusalKind.MISBOUND, reason=reason)


@dataclass(frozen=True, slots=True, kw_only=True)
class Screened:
    """A batch of events with its untrusted outcomes taken out."""

    trusted: list[bool]
    """Per event of the batch: whether to act on it (not an outcome, or a signed one)."""
    refusals: list[Emitted]
    """One ``ai.agent.tool.outcome.refused`` per untrusted outcome, to publish."""


def screen(verifier: OutcomeVerifier, events: Sequence[Envelope], reader: Source) -> Screened:
    """Which of ``events`` ``reader`` may act on; each refusal counted and to be audited."""
    trusted: list[bool] = []
    refusals: list[Emitted] = []
    for event in events:
        refusal = verifier.refusal(event)
        trusted.append(refusal is None)
        if refusal is not None:
            OUTCOMES_REFUSED.labels(reader=reader.name.lower(), refusal=refusal.kind).inc()
            refusals.append(
                refused_outcome_event(event, reader, refusal=refusal.kind, reason=refusal.reason)
            )
    return Screened(trusted=trusted, refusals=refusals)
