"""Kafka protocol binding for CloudEvents, through the ``cloudevents`` SDK.

Decoding picks the mode by ``content-type`` as the binding says: a value whose
``content-type`` is ``application/cloudevents+json`` is a structured event; anything
else with ``ce_*`` headers is binary. Encoding emits binary mode on the pipeline
topics and structured mode on ``toolfleet.audit`` and ``toolfleet.dlq``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from pydantic import ValidationError

from toolfleet.errors import InvalidEvent
from toolfleet.events.envelope import Envelope, field_errors

STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"
_FORMAT = JSONFormat()


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
    event = CloudEvent(attributes=envelope.attributes(), data=envelope.data)
    if mode is ContentMode.BINARY:
        message = ce_kafka.to_binary(event, _FORMAT)
    else:
        message = ce_kafka.to_structured(event, _FORMAT)
    key = message.key.encode() if isinstance(message.key, str) else message.key
    return WireMessage(key=key, value=message.value, headers=list(message.headers.items()))


def content_mode(headers: Iterable[tuple[str, bytes]]) -> ContentMode | None:
    """The content mode the headers announce, or ``None`` if this is no CloudEvent."""
    has_ce_headers = False
    for name, value in headers:
        lowered = name.lower()
        if lowered == "content-type" and value.split(b";")[0].strip().lower().startswith(
            b"application/cloudevents"
        ):
            return ContentMode.STRUCTURED
        if lowered.startswith("ce_"):
            has_ce_headers = True
    return ContentMode.BINARY if has_ce_headers else None


def decode(
    *, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes]]
) -> Envelope:
    """Decode a Kafka message in either content mode into an :class:`Envelope`.

    Raises :class:`InvalidEvent` with a safe reason for anything that is not a valid
    CloudEvent with a JSON object as ``data``.
    """
    mode = content_mode(headers)
    if mode is None:
        raise InvalidEvent("not a CloudEvent: no ce_* headers and no structured content-type")
    message = ce_kafka.KafkaMessage(headers=dict(headers), key=key, value=value or b"")
    try:
        if mode is ContentMode.STRUCTURED:
            event = ce_kafka.from_structured(message, _FORMAT)
        else:
            event = ce_kafka.from_binary(message, _FORMAT)
    except Exception as exc:  # the SDK raises many types for malformed input
        raise InvalidEvent(f"undecodable {mode} CloudEvent: {type(exc).__name__}") from None
    return _to_envelope(event.get_attributes(), event.get_data())


def _to_envelope(attributes: dict[str, Any], data: object) -> Envelope:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidEvent("CloudEvent data must be a JSON object")
    # Extensions toolfleet does not know are legal CloudEvents and are dropped here.
    known = Envelope.model_fields.keys() - {"data"}
    attrs = {k: v for k, v in attributes.items() if k in known}
    try:
        envelope = Envelope.model_validate({**attrs, "data": data})
    except ValidationError as exc:
        raise InvalidEvent(
            "invalid CloudEvent attributes", details={"errors": field_errors(exc)}
        ) from None
    if envelope.specversion != "1.0":
        raise InvalidEvent(f"unsupported specversion {envelope.specversion!r}")
    return envelope
