"""Which call an event belongs to and which trace: read the same way by every service.

Pure functions of an :class:`~toolfleet.events.envelope.Envelope`:

- the W3C ``traceparent`` parser (one for the API, the bus runtime, audit and status);
- :func:`with_trace`: the trace of a request that arrived without one. Its id is derived
  from the event's ``source`` + ``id``, so every service that reads the event (policy,
  audit, status), and any of them after a redelivery, names the same trace, and every
  event derived from it inherits that ``traceparent``;
- the invocation id and tenant an event is about, as policy names them;
- :class:`CallRef`: which call (invocation, tenant, agent, tool, version) and which trace,
  built once from the invocation's event and carried wherever the call is named;
- :class:`CallKey`: the part of it that names the call's shared state. A call is
  ``(tenant_id, invocation_id)``: every Redis key, lease, cancel flag, pending approval,
  idempotency record, checkpoint and pin of a call is named by both, so a request of
  one tenant that names another tenant's invocation id reaches none of its state.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import uuid
from dataclasses import dataclass, replace
from typing import Any, Final

from toolfleet.errors import InvalidEvent
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import InvokeAuthorized, InvokeExecuted
from toolfleet.events.types import EventType

#: ``version-traceid-parentid-flags``; a version above ``00`` may append fields.
_TRACEPARENT: Final = re.compile(
    r"^(?P<version>[0-9a-f]{2})-(?P<trace_id>[0-9a-f]{32})-(?P<parent_id>[0-9a-f]{16})"
    r"-(?P<flags>[0-9a-f]{2})(?P<rest>-.*)?$"
)
_SAMPLED: Final = "01"
_MAX_TEXT: Final = 512
_TRACE_NAMESPACE: Final = b"toolfleet:trace\x1f"


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceParent:
    """A well-formed W3C trace context ``traceparent`` (Trace Context Level 1)."""

    trace_id: str
    """32 lowercase hex digits, not all zero."""
    parent_id: str
    """16 lowercase hex digits, not all zero: the span the receiver's spans are children of."""
    flags: str = _SAMPLED
    """Trace flags as two hex digits (``01``: sampled)."""

    def __str__(self) -> str:
        return f"00-{self.trace_id}-{self.parent_id}-{self.flags}"


@dataclass(frozen=True, slots=True, kw_only=True)
class CallKey:
    """Which call a piece of shared state belongs to: its tenant and its invocation id.

    What the stores take (cancel flags, leases, approvals, idempotency, checkpoints,
    pins); :attr:`CallRef.key` gives it for a call whose identity is known in full.
    """

    tenant_id: str
    invocation_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRef:
    """One call's identity and trace: what outcomes, grants and logs name it by."""

    invocation_id: str
    tenant_id: str
    agent_did: str
    tool_id: str
    tool_version: str | None = None
    """The resolved version; ``None`` before policy resolved it (or could not)."""
    trace: str | None = None
    """The invocation's ``traceparent`` (every event of the call carries it)."""

    @classmethod
    def of(cls, call: InvokeAuthorized | InvokeExecuted, *, trace: str | None = None) -> CallRef:
        """The identity of an authorized or executed call (its version is resolved)."""
        return cls(
            invocation_id=str(call.invocation_id),
            tenant_id=call.agent_context.tenant_id,
            agent_did=call.agent_context.agent_did,
            tool_id=call.tool_id,
            tool_version=call.tool_version,
            trace=trace,
        )

    @property
    def key(self) -> CallKey:
        """What this call's shared state is named by."""
        return CallKey(tenant_id=self.tenant_id, invocation_id=self.invocation_id)

    def resolved(self, tool_version: str) -> CallRef:
        """This call at the version policy resolved."""
        return replace(self, tool_version=tool_version)


def parse_traceparent(value: str | None) -> TraceParent | None:
    """``value`` as a :class:`TraceParent`; ``None`` if absent or not valid W3C.

    Invalid per the spec: version ``ff``, a version ``00`` value with anything appended,
    an all-zero trace or parent id, upper-case hex.
    """
    match = _TRACEPARENT.match(value or "")
    if match is None:
        return None
    version, trace_id, parent_id = match["version"], match["trace_id"], match["parent_id"]
    if version == "ff" or (version == "00" and match["rest"] is not None):
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return TraceParent(trace_id=trace_id, parent_id=parent_id, flags=match["flags"])


#: A version ``00`` traceparent, the form every toolfleet event carries: its trace id
#: is read without building a :class:`TraceParent` (every record a worker handles).
_TRACEPARENT_00: Final = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_TRACEPARENT_00_LENGTH: Final = 55
_ZERO_TRACE: Final = "0" * 32
_ZERO_PARENT: Final = "0" * 16


def _trace_id_00(value: str | None) -> str | None:
    """The trace id of a valid version ``00`` ``traceparent``; ``None`` for anything else
    (which may still be valid in another version: ask :func:`parse_traceparent`)."""
    if value is None or len(value) != _TRACEPARENT_00_LENGTH:
        return None
    match = _TRACEPARENT_00.fullmatch(value)
    if match is None or match[1] == _ZERO_TRACE or match[2] == _ZERO_PARENT:
        return None
    return match[1]


def valid_traceparent(value: str | None) -> str | None:
    """``value`` in version ``00`` form when it is a valid ``traceparent``, else ``None``."""
    parsed = parse_traceparent(value)
    return str(parsed) if parsed is not None else None


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a ``traceparent``, if it is valid."""
    trace_id = _trace_id_00(traceparent)
    if trace_id is not None:
        return trace_id
    parsed = parse_traceparent(traceparent)
    return parsed.trace_id if parsed is not None else None


def traceparent_in(trace_id: str | None) -> str | None:
    """A ``traceparent`` for a new span of trace ``trace_id``; ``None`` if it is not valid.

    How an event sent later about an invocation (a cancel, an approval) joins the
    invocation's trace when only its trace id was kept (the status row).
    """
    return valid_traceparent(f"00-{trace_id}-{secrets.token_hex(8)}-{_SAMPLED}")


def new_traceparent() -> str:
    """A fresh, random ``traceparent``: a new trace, sampled."""
    return str(TraceParent(trace_id=secrets.token_hex(16), parent_id=secrets.token_hex(8)))


def derived_traceparent(source: str, event_id: str) -> str:
    """The ``traceparent`` of the trace an event without one starts.

    A function of ``source`` + ``id`` (the event's dedupe key): every reader of the
    event, and a redelivery of it, derive the same trace.
    """
    digest = hashlib.sha256(_TRACE_NAMESPACE + f"{source}\x1f{event_id}".encode()).hexdigest()
    # An all-zero id is invalid; a digest of 128 zero bits is as likely as a collision.
    trace_id = digest[:32] if digest[:32] != "0" * 32 else "0" * 31 + "1"
    parent_id = digest[32:48] if digest[32:48] != "0" * 16 else "0" * 15 + "1"
    return str(TraceParent(trace_id=trace_id, parent_id=parent_id))


def with_trace(envelope: Envelope) -> Envelope:
    """``envelope`` with a valid ``traceparent``: its own, or the one it starts.

    An invalid ``traceparent`` is replaced as a missing one is (W3C: a receiver that
    cannot parse it starts a new trace); ``tracestate`` then goes with it.
    """
    if trace_id_of(envelope.traceparent) is not None:
        return envelope
    return envelope.model_copy(
        update={
            "traceparent": derived_traceparent(envelope.source, envelope.id),
            "tracestate": None,
        }
    )


_UUID_LEN: Final = 36
_CANONICAL_UUID: Final = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_canonical_uuid(value: object) -> bool:
    """``value`` is a UUID as ``str(uuid.UUID(value))`` writes it (so it is its own)."""
    return (
        type(value) is str
        and len(value) == _UUID_LEN
        and _CANONICAL_UUID.fullmatch(value) is not None
    )


def canonical_uuid(text: str) -> str:
    """``str(uuid.UUID(text))``: the UUID ``text`` spells, as its canonical string.

    Ids arrive canonical nearly always (every id the fleet makes is), and for those this
    is the text itself, checked by one regular expression in about a tenth of the 3-4
    µs a ``UUID`` costs to parse and format again. Audit, status and policy read one or
    more per lifecycle event.

    Raises:
        ValueError: ``text`` is not a UUID (as ``uuid.UUID`` raises it).
    """
    if is_canonical_uuid(text):
        return text
    return str(uuid.UUID(text))


def invocation_uuid(text: str, *, tenant_id: str) -> str:
    """The invocation id as a UUID string; a non-UUID id maps stably to one.

    The map is a ``uuid5`` of the tenant and the text: the same tenant sending the same
    text always gets the same id, and two tenants' ``job-1`` get two ids, so a tenant
    cannot claim beforehand the id another tenant's text derives to. A lone surrogate,
    which JSON may carry as ``\\ud800``, is hashed as its three UTF-8 bytes instead of
    failing. A UUID is the producer's own choice and is kept as it is.
    """
    try:
        return canonical_uuid(text)
    except ValueError:
        # A unit separator cannot occur in a tenant id (TENANT_ID_PATTERN).
        name = f"toolfleet:invocation:{tenant_id}\x1f{text}".encode("utf-8", "surrogatepass")
        digest = hashlib.sha1(uuid.NAMESPACE_URL.bytes + name, usedforsecurity=False).digest()
        return str(uuid.UUID(bytes=digest[:16], version=5))


def invocation_id_of(event: Envelope) -> str | None:
    """The invocation an event is about, as policy names it; ``None`` for fleet events.

    A non-UUID id is derived within the event's tenant (:func:`tenant_of`).
    """
    raw = _text(event.data.get("invocation_id")) or event.invocationid
    if raw is None and event.type == EventType.INVOKE_REQUESTED:
        raw = event.id  # the contract: invocation_id defaults to the event id
    return invocation_uuid(raw[:256], tenant_id=tenant_of(event) or "") if raw else None


def tenant_of(event: Envelope) -> str | None:
    """The tenant an event names: its attribute, else its data's (read leniently)."""
    agent = event.data.get("agent_context")
    agent_tenant = _text(agent.get("tenant_id")) if isinstance(agent, dict) else None
    return event.tenantid or _text(event.data.get("tenant_id")) or agent_tenant


def _text(value: Any) -> str | None:
    return value[:_MAX_TEXT] if isinstance(value, str) and value else None


KEY_TENANT_MISMATCH: Final = "key_tenant_mismatch"
"""The DLQ reason of a request whose Kafka key names another tenant (contract 9)."""


def check_key_tenant(event: Envelope, key: bytes | None) -> None:
    """Raise :class:`~toolfleet.errors.InvalidEvent` (``details.reason`` =
    ``key_tenant_mismatch``) when a record's Kafka key is not the tenant its event names.

    The key is what partitions, orders and routes a tenant's records; an event that
    disagrees with it is not trusted by anyone (policy and status dead-letter it). A
    record without a key is judged by its event alone.
    """
    if key is None:
        return
    try:
        key_tenant: str | None = key.decode("utf-8")
    except UnicodeDecodeError:
        key_tenant = None
    if key_tenant is None or key_tenant != tenant_of(event):
        raise InvalidEvent(
            "the message key names another tenant than the event's tenantid",
            details={"reason": KEY_TENANT_MISMATCH},
        )
