"""Kafka protocol binding for CloudEvents: both content modes, bytes in and out.

Decoding picks the mode by ``content-type`` as the binding says: a value whose
``content-type`` is ``application/cloudevents+json`` is a structured event; anything
else with ``ce_*`` headers is binary. Encoding emits binary mode on the pipeline
topics and structured mode on ``toolfleet.audit`` and ``toolfleet.dlq``.

The mapping is the ``cloudevents`` SDK's (``cloudevents.core.bindings.kafka`` with its
JSON format): ``ce_``-prefixed headers, ``datacontenttype`` as ``content-type``, the
``partitionkey`` extension as the Kafka key, ``time`` in RFC 3339 with ``Z`` for UTC, an
event without ``specversion`` or ``time`` given ``1.0`` and the current time. It is
written out here rather than called because every service decodes every record it
reads: the SDK builds a validated ``CloudEvent`` object and parses ``time`` with
``dateutil`` before :class:`~toolfleet.events.envelope.Envelope` validates the same
attributes again, a fifth of an observing service's CPU (``bench/PROFILE.md``). Here
the headers become one dict that the envelope validates once, and JSON goes through
``orjson``. ``tests/unit/test_codec.py`` holds the two to the same events, both ways.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import orjson
from pydantic import ValidationError

from toolfleet import json_text
from toolfleet.errors import InvalidEvent
from toolfleet.events.envelope import Envelope, field_errors

STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"
_STRUCTURED_HEADERS = (("content-type", STRUCTURED_CONTENT_TYPE.encode()),)
_CE_PREFIX = "ce_"
#: Envelope attributes a message may set (everything else is an unknown extension).
_KNOWN = frozenset(Envelope.model_fields) - {"data"}
#: Attribute order on the wire: the envelope's field order.
_KNOWN_ORDER = tuple(name for name in Envelope.model_fields if name != "data")
#: Attributes the CloudEvents spec says must not be empty when present.
_NON_EMPTY = ("subject", "datacontenttype")
_DUMPS_OPTIONS = orjson.OPT_NON_STR_KEYS


class ContentMode(StrEnum):
    BINARY = "binary"
    STRUCTURED = "structured"


@dataclass(frozen=True, slots=True, kw_only=True)
class WireMessage:
    """One Kafka message as bytes: what a producer sends and a consumer receives."""

    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


def encode(envelope: Envelope, mode: ContentMode = ContentMode.BINARY) -> WireMessage:
    """Encode ``envelope``; the Kafka key is its ``partitionkey`` (the tenant id)."""
    key = envelope.partitionkey.encode() if envelope.partitionkey is not None else None
    attributes = _wire_attributes(envelope)
    if mode is ContentMode.BINARY:
        headers = [(_HEADER_OF[name], text.encode()) for name, text in attributes.items()]
        return WireMessage(key=key, value=_dumps(envelope.data), headers=headers)
    value = _dumps({**attributes, "data": envelope.data})
    return WireMessage(key=key, value=value, headers=list(_STRUCTURED_HEADERS))


#: Attribute -> its binary-mode header.
_HEADER_OF: dict[str, str] = {
    name: "content-type" if name == "datacontenttype" else _CE_PREFIX + name
    for name in _KNOWN_ORDER
}


def _wire_attributes(envelope: Envelope) -> dict[str, str]:
    """Attributes as the strings the wire carries, unset optionals left out."""
    fields = envelope.__dict__  # a pydantic model's field values, read without getattr
    attributes: dict[str, str] = {}
    for name in _KNOWN_ORDER:
        value = fields[name]
        if value is not None:
            attributes[name] = value if isinstance(value, str) else _format_time(value)
    if "time" not in attributes:
        attributes["time"] = _format_time(datetime.now(UTC))
    return attributes


def _format_time(value: datetime) -> str:
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _dumps(value: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(value, option=_DUMPS_OPTIONS)
    except TypeError:
        # Integers past 64 bits, or text with a lone surrogate (valid JSON as a \\ud800
        # escape, not as UTF-8): the standard library writes both, ASCII-escaped.
        return json.dumps(value, separators=(",", ":")).encode()


#: Header name -> (attribute, whether it is a ``ce_`` header), for the names toolfleet
#: writes; any other spelling takes the general path in :func:`_header_attributes`.
_HEADER_ATTRIBUTES: dict[str, tuple[str, bool]] = {
    **{_CE_PREFIX + name: (name, True) for name in _KNOWN},
    "content-type": ("datacontenttype", False),
}


def _announces_structured(content_type: bytes) -> bool:
    return content_type.split(b";")[0].strip().lower().startswith(b"application/cloudevents")


#: Stands for a header value that is not UTF-8 text (or a null value) until a later
#: header of the same name replaces it.
_UNDECODABLE: Any = object()


#: Header name -> attribute, for the names toolfleet writes (:func:`_header_attributes`'
#: fast path).
_ATTRIBUTE_OF: dict[str, str] = {name: attr for name, (attr, _) in _HEADER_ATTRIBUTES.items()}
_JSON_CONTENT_TYPE = "application/json"


def _header_attributes(
    headers: Sequence[tuple[str, bytes | None]],
) -> tuple[ContentMode | None, dict[str, Any], bool]:
    """The content mode, for binary mode the attributes the headers carry (as text), and
    whether any header took the general path (a spelling toolfleet does not write, or
    an extension it does not know: the caller filters those).

    What toolfleet writes (each header once, by the names it writes, UTF-8 values, JSON
    data) is read in one comprehension; anything else as
    :func:`_header_attributes_in_general` reads it, which this fast path equals
    (``tests/unit/test_codec.py``): it was a fifth of decoding a record.
    """
    try:
        attributes = {_ATTRIBUTE_OF[name]: raw.decode() for name, raw in headers}  # type: ignore[union-attr]
    except (KeyError, AttributeError, UnicodeDecodeError):
        return _header_attributes_in_general(headers)
    content_type = attributes.get("datacontenttype")
    if len(attributes) != len(headers) or (
        content_type is not None and content_type != _JSON_CONTENT_TYPE
    ):
        return _header_attributes_in_general(headers)  # a repeated name, another content type
    if len(attributes) == (content_type is not None):  # no ce_* header
        return None, {}, False
    return ContentMode.BINARY, attributes, False


def _header_attributes_in_general(
    headers: Iterable[tuple[str, bytes | None]],
) -> tuple[ContentMode | None, dict[str, Any], bool]:
    """:func:`_header_attributes` of any headers.

    One pass: a ``content-type`` announcing a structured event decides at once, as the
    binding says; otherwise ``ce_*`` headers (any case) make the event binary, the last
    of a repeated name winning, and ``content-type`` is its ``datacontenttype``.
    """
    attributes: dict[str, Any] = {}
    has_ce_headers = general = undecodable = False
    for name, raw in headers:
        known = _HEADER_ATTRIBUTES.get(name)
        if known is None:
            lowered = name.lower()
            if lowered.startswith(_CE_PREFIX):
                known = (lowered[3:], True)
            elif lowered == "content-type":
                known = ("datacontenttype", False)
            else:
                continue
            general = True
        attribute, is_ce_header = known
        if is_ce_header:
            has_ce_headers = True
        elif raw is not None and _announces_structured(raw):
            return ContentMode.STRUCTURED, {}, False
        try:
            attributes[attribute] = raw.decode()  # type: ignore[union-attr]
        except (UnicodeDecodeError, AttributeError):  # not UTF-8, or a null value
            attributes[attribute] = _UNDECODABLE
            undecodable = True
    if not has_ce_headers:
        return None, {}, False
    if undecodable and any(value is _UNDECODABLE for value in attributes.values()):
        raise InvalidEvent("undecodable binary CloudEvent")
    return ContentMode.BINARY, attributes, general


def decode(
    *, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
) -> Envelope:
    """Decode a Kafka message in either content mode into an :class:`Envelope`.

    Raises :class:`InvalidEvent` with a safe reason for anything that is not a valid
    CloudEvent with a JSON object as ``data``.
    """
    mode, attributes, general = _header_attributes(headers)
    if mode is None:
        raise InvalidEvent("not a CloudEvent: no ce_* headers and no structured content-type")
    try:
        if mode is ContentMode.STRUCTURED:
            attributes, data = _structured(value or b"")
            general = True  # any member of the JSON object may be an unknown extension
        else:
            data = json_text.loads(value) if value else None
        if key is not None:
            attributes["partitionkey"] = key.decode()
    except (ValueError, TypeError, RecursionError):  # malformed JSON, UTF-8 or shape
        raise InvalidEvent(f"undecodable {mode} CloudEvent") from None
    return _to_envelope(mode, attributes, data, filtered=not general)


def _structured(value: bytes) -> tuple[dict[str, Any], object]:
    attributes = json_text.loads(value)
    if not isinstance(attributes, dict):
        raise TypeError("a structured CloudEvent is a JSON object")
    data = attributes.pop("data", None)
    if data is None and attributes.pop("data_base64", None) is not None:
        data = b""  # binary data: never a JSON object, refused below
    return attributes, data


def _to_envelope(
    mode: ContentMode, attributes: dict[str, Any], data: object, *, filtered: bool = False
) -> Envelope:
    """``filtered``: ``attributes`` holds only names of :data:`_KNOWN` already."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidEvent("CloudEvent data must be a JSON object")
    specversion = attributes.setdefault("specversion", "1.0")
    if specversion != "1.0":
        raise InvalidEvent(f"unsupported specversion {specversion!r}")
    for name in _NON_EMPTY:
        if name in attributes and not attributes[name]:
            raise InvalidEvent(f"undecodable {mode} CloudEvent: empty attribute")
    # Extensions toolfleet does not know are legal CloudEvents and are dropped here.
    known = attributes if filtered else {n: v for n, v in attributes.items() if n in _KNOWN}
    if "time" not in known:
        known["time"] = datetime.now(UTC)  # as the SDK stamps an event that lacks one
    elif not isinstance(known["time"], str):
        raise InvalidEvent(f"undecodable {mode} CloudEvent: time is not an RFC 3339 string")
    known["data"] = data
    try:
        envelope = Envelope.model_validate(known)
    except ValidationError as exc:
        raise InvalidEvent(
            "invalid CloudEvent attributes", details={"errors": field_errors(exc)}
        ) from None
    if envelope.time is not None and envelope.time.tzinfo is None:
        raise InvalidEvent("CloudEvent time must carry a UTC offset")
    return envelope
