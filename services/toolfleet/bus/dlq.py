"""DLQ records: the original key, headers and value (base64), where it came from, why.

A DLQ record carries a ``traceparent`` like every event: the dead-lettered event's
trace, or one of its own derived from its id when the message had none.

**No live credential reaches the DLQ** (contract 9): every consumer dead-letters
through :func:`dlq_message`, which keeps the original bytes except capability tokens
(:func:`redact_credentials`), and says what it replaced in the DLQ message's header
``toolfleet_redacted``:

* a JSON value (binary mode: the ``data``; structured mode: the whole event, valid or
  not): every ``capability_token`` member, wherever it sits, gets the string
  ``"[redacted]"``; only the token's bytes change. A value whose members are spelled
  in a way the byte-level replacement cannot see (escaped names, a non-string token)
  is written again from its parsed form, with the tokens replaced: then the bytes
  change, the meaning does not (header: ``data.capability_token``);
* a value that is not JSON (truncated, another encoding): a ``capability_token``
  member is replaced as above, and so is any JWT-shaped run (``eyJ...``, three
  base64url parts) anywhere in it, whatever its name (header: ``jwt``);
* header values: JWT-shaped runs are replaced (header: ``headers``).
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from toolfleet.errors import ErrorInfo
from toolfleet.events.codec import ContentMode, WireMessage, encode
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import derived_traceparent
from toolfleet.events.models import DlqHeader, DlqRecord
from toolfleet.events.types import EventType

MARKER: Final = "[redacted]"
"""What replaces a credential in a DLQ record."""
REDACTED_HEADER: Final = "toolfleet_redacted"
"""Header of a DLQ message whose record had credentials replaced: what was replaced."""
TOKEN_FIELD: Final = "capability_token"  # noqa: S105 (a member name, not a secret)

_WS = rb"[ \t\n\r]*"
_JSON_STRING = rb'"(?:[^"\\]|\\.)*"'
#: A ``capability_token`` member whose value is a JSON string; group 1 keeps the name.
_TOKEN_MEMBER = re.compile(
    rb'("' + TOKEN_FIELD.encode() + rb'"' + _WS + rb":" + _WS + rb")" + _JSON_STRING, re.DOTALL
)
#: A run of base64url characters and dots (a compact JWS/JWT is one: ``eyJ...`` header,
#: payload, signature). Runs are matched whole, so the scan stays linear in the value.
_RUN = re.compile(rb"[A-Za-z0-9_.-]+")
_MARKER_JSON = json.dumps(MARKER).encode()
_NOT_JSON = object()


@dataclass(frozen=True, slots=True)
class Redacted:
    """A value with its credentials replaced, and what was replaced (empty: nothing)."""

    value: bytes
    replaced: tuple[str, ...] = ()


def redact_credentials(value: bytes) -> Redacted:
    """``value`` with every capability token replaced by :data:`MARKER` (module doc)."""
    parsed = _parse(value)
    if parsed is _NOT_JSON:
        out, members = _TOKEN_MEMBER.subn(lambda m: m.group(1) + _MARKER_JSON, value)
        out, jwts = _redact_jwts(out)
        replaced = (("data.capability_token",) if members else ()) + (("jwt",) if jwts else ())
        return Redacted(out, replaced)
    expected, found = _without_tokens(parsed)
    if not found:
        return Redacted(value)
    out = _TOKEN_MEMBER.sub(lambda m: m.group(1) + _MARKER_JSON, value)
    # Only the token strings changed if the result means the same with markers. A
    # repeated name could hide a copy the parser drops, escaped names and non-string
    # tokens escape the pattern: then the value is written again from its parsed form.
    if _repeats_a_name(value) or _parse(out) != expected:
        out = json.dumps(expected, ensure_ascii=False, separators=(",", ":")).encode()
    return Redacted(out, ("data.capability_token",))


def _parse(value: bytes) -> Any:
    try:
        return json.loads(value)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return _NOT_JSON


class _Repeated(Exception):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise _Repeated
    return found


def _repeats_a_name(value: bytes) -> bool:
    """Whether an object of ``value`` (valid JSON) names a member twice."""
    try:
        json.loads(value, object_pairs_hook=_unique)
    except _Repeated:
        return True
    return False


def _without_tokens(parsed: Any) -> tuple[Any, bool]:
    """A copy of ``parsed`` with every ``capability_token`` member set to the marker,
    and whether there was one (iterative: hostile nesting cannot exhaust the stack)."""
    root: list[Any] = [None]
    found = False
    work: list[tuple[Any, list[Any] | dict[str, Any], int | str]] = [(parsed, root, 0)]
    while work:
        node, parent, slot = work.pop()
        if isinstance(node, dict):
            copy: dict[str, Any] = {}
            for name, item in node.items():
                if name == TOKEN_FIELD:
                    copy[name], found = MARKER, True
                else:
                    copy[name] = None
                    work.append((item, copy, name))
            parent[slot] = copy  # type: ignore[index]
        elif isinstance(node, list):
            items: list[Any] = [None] * len(node)
            work.extend((item, items, n) for n, item in enumerate(node))
            parent[slot] = items  # type: ignore[index]
        else:
            parent[slot] = node  # type: ignore[index]
    return root[0], found


def _redact_jwts(value: bytes) -> tuple[bytes, int]:
    """``value`` with each JWT-shaped run replaced from its ``eyJ`` on (a base64url
    JSON header followed by at least two more dot-separated parts)."""
    found = 0

    def replace(match: re.Match[bytes]) -> bytes:
        nonlocal found
        run = match.group()
        at = run.find(b"eyJ")
        if at < 0 or run.count(b".", at) < 2:
            return run
        found += 1
        return run[:at] + MARKER.encode()

    return _RUN.sub(replace, value), found


def _redact_header(value: bytes) -> tuple[bytes, bool]:
    out, found = _redact_jwts(value)
    return out, found > 0


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def dlq_message(
    *,
    source: str,
    consumer_group: str,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    key: bytes | None,
    headers: list[tuple[str, bytes]],
    value: bytes | None,
    error: ErrorInfo,
    traceparent: str | None = None,
) -> WireMessage:
    """A structured-mode CloudEvent for ``toolfleet.dlq``, keyed by the original key when
    it names a tenant, with the record's credentials replaced (:func:`redact_credentials`)."""
    redacted = redact_credentials(value or b"")
    replaced = list(redacted.replaced)
    kept_headers: list[DlqHeader] = []
    for name, header in headers:
        header_value, changed = _redact_header(header or b"")
        if changed and "headers" not in replaced:
            replaced.append("headers")
        kept_headers.append(DlqHeader(key=name, value_b64=_b64(header_value)))
    record = DlqRecord(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp_ms,
        key_b64=_b64(key) if key is not None else None,
        headers=kept_headers,
        value_b64=_b64(redacted.value),
        consumer_group=consumer_group,
        error=error,
        failed_at=datetime.now(UTC),
    )
    tenant = _tenant_of(key)
    # Deterministic: the same bad message dead-lettered twice is one DLQ event.
    event_id = str(
        uuid.uuid5(uuid.NAMESPACE_URL, f"dlq:{consumer_group}:{topic}:{partition}:{offset}")
    )
    envelope = Envelope(
        id=event_id,
        source=source,
        type=EventType.DLQ_RECORD,
        time=record.failed_at,
        tenantid=tenant,
        partitionkey=tenant,
        traceparent=traceparent or derived_traceparent(source, event_id),
        data=record.model_dump(mode="json"),
    )
    wire = encode(envelope, ContentMode.STRUCTURED)
    if replaced:
        wire.headers.append((REDACTED_HEADER, ",".join(replaced).encode()))
    # Keyed by the tenant (the original key when it names one): a key that is not a
    # tenant (not UTF-8, unprintable) stays in ``key_b64`` only, or the DLQ record itself
    # could not be decoded by a CloudEvents reader.
    return WireMessage(
        key=tenant.encode() if tenant is not None else None,
        value=wire.value,
        headers=wire.headers,
    )


def _tenant_of(key: bytes | None) -> str | None:
    if not key:
        return None
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() and len(text) <= 128 else None
