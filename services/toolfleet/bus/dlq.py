"""DLQ records: the original key, headers and value (base64), where it came from, why.

A DLQ record carries a ``traceparent`` like every event: the dead-lettered event's
trace, or one of its own derived from its id when the message had none.
"""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime

from toolfleet.errors import ErrorInfo
from toolfleet.events.codec import ContentMode, WireMessage, encode
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import derived_traceparent
from toolfleet.events.models import DlqHeader, DlqRecord
from toolfleet.events.types import EventType


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
    """A structured-mode CloudEvent for ``toolfleet.dlq``, keyed by the original key."""
    record = DlqRecord(
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=timestamp_ms,
        key_b64=_b64(key) if key is not None else None,
        headers=[DlqHeader(key=k, value_b64=_b64(v or b"")) for k, v in headers],
        value_b64=_b64(value or b""),
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
    return WireMessage(key=key, value=wire.value, headers=wire.headers)


def _tenant_of(key: bytes | None) -> str | None:
    if not key:
        return None
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return text if text.isprintable() and len(text) <= 128 else None
