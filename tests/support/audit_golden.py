"""Writes the audit golden file: ``python -m tests.support.audit_golden``.

Representative lifecycle events of every type (and the odd ones audit must still
record: malformed data, unknown types, secrets and PII in every free-text field), each
both as a service builds it in process and as the audit worker decodes it from the
wire. The golden file holds, per event, the structured audit event audit emits for it
(its ``time`` pinned, the only attribute that is the clock's), byte for byte.
``tests/unit/test_audit_golden.py`` fails when one byte drifts; rerun this module only
after a deliberate change of the audit output, and review the diff.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from enum import IntEnum
from pathlib import Path
from typing import Any

from tests.support.lifecycle import T0, Lifecycle
from toolfleet.audit.records import audit_event
from toolfleet.errors import ErrorCode
from toolfleet.events.codec import ContentMode, decode, encode
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import InvocationStatus
from toolfleet.events.types import EventType, Source

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "audit" / "events.json"
NOW = datetime(2025, 1, 1, 13, 0, tzinfo=UTC)
#: The audit event's own ``time`` is when audit emitted it: pinned to compare bytes.
EMITTED = datetime(2025, 1, 1, 13, 0, 1, 250_000, tzinfo=UTC)
TOPIC = "toolfleet.invoke.events"

PII_TEXT = (
    "mail bob@example.com or call +1 415-555-0100, card 4111 1111 1111 1111, "
    "ssn 123-45-6789 from 10.1.2.3 with Bearer abc.def.123 and "
    "key AKIAABCDEFGHIJKLMNOP token eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.sig"
)
PARAMETERS: dict[str, Any] = {
    "query": "mail alice@example.com about it",
    "api_key": "sk-live-123",
    "Authorization": "Basic dXNlcjpwYXNz",
    "nested": [{"auth": {"Authorization": "Bearer abc.def.123"}}, "ok", 4111111111111111],
    "limit": 10,
    "ratio": 0.5,
    "flag": True,
    "none": None,
    "capability_token": "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl",
    "bob@example.com": "a key that is an address",
    "bob@example.org": "another one that masks to the same key",
    "long": "x" * 5000,
    "secretive": {"cardNumber": "4111111111111111", "x-api-key": "k"},
    "text": PII_TEXT,
    "digest": "0123456789abcdef0123456789abcdef",
    "random": "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3z",
    "unicode": "héllo wörld ✓ 日本",
}


class Level(IntEnum):
    HIGH = 3


def _lifecycle(n: int, **extra: Any) -> Lifecycle:
    return Lifecycle(
        invocation_id=f"00000000-0000-4000-8000-{n:012d}",
        traceparent=f"00-{n:032x}-{n + 1:016x}-01",
        **extra,
    )


def _with(event: Envelope, **data: Any) -> Envelope:
    return event.model_copy(update={"data": {**event.data, **data}})


def _attrs(event: Envelope, **attributes: Any) -> Envelope:
    return event.model_copy(update=attributes)


def _plain(event_type: str, data: dict[str, Any], **attributes: Any) -> Envelope:
    fields: dict[str, Any] = {
        "id": f"evt-{event_type}",
        "source": Source.EXECUTOR,
        "type": event_type,
        "time": T0,
        "tenantid": "t_acme",
        "traceparent": f"00-{7:032x}-{8:016x}-01",
        **attributes,
    }
    return Envelope(**fields, data=data)


def cases() -> dict[str, Envelope]:
    """Name → lifecycle event, as a service builds it (no wire round trip)."""
    lc = _lifecycle(1)
    pii = _lifecycle(2, parameters=PARAMETERS, authid="did:agent:pii")
    error = InvocationStatus.ERROR
    built: dict[str, Envelope] = {
        "requested": lc.requested(),
        "requested_pii": pii.requested(),
        "requested_spoofed_auth": _attrs(lc.requested(), authtype="x", authid="spoofed"),
        "requested_no_invocation_id": _attrs(
            _with(lc.requested(), invocation_id=None), invocationid=None
        ),
        "authorized": lc.authorized(),
        "authorized_pii": pii.authorized(),
        "approval_requested": lc.approval_requested(),
        "approval_granted": lc.approval(granted=True),
        "approval_granted_claimed_auth": _attrs(
            lc.approval(granted=True), authtype="app_user", authid="x"
        ),
        "approval_denied": lc.approval(granted=False),
        "invoked": lc.invoked(),
        "invoked_resumed": _with(lc.invoked(attempt=2), resumed_from_checkpoint_id="cp-40"),
        "checkpoint": lc.checkpoint(40, "fetching"),
        "executed": lc.executed(),
        "executed_documents": _with(
            lc.executed(),
            documents_accessed=[
                {"document_id": "handbook", "version": "1", "access": "read"},
                "not a dict",
                {"document_id": "faq"},
            ],
        ),
        "cancel_requested": lc.cancel_requested(),
        "cancel_requested_pii": _with(lc.cancel_requested(), reason=PII_TEXT),
        "succeeded": lc.outcome(),
        "succeeded_documents": _with(
            lc.outcome(),
            documents_accessed=[{"document_id": "handbook", "version": "2", "access": "search"}],
        ),
        "failed": lc.outcome(error),
        "failed_pii_message": _with(
            lc.outcome(error),
            error={"code": "tool_execution_error", "message": PII_TEXT, "retryable": True},
        ),
        "failed_permission_denied": lc.outcome(
            InvocationStatus.PERMISSION_DENIED, code=ErrorCode.PERMISSION_DENIED
        ),
        "timeout": lc.outcome(InvocationStatus.TIMEOUT, code=ErrorCode.TIMEOUT),
        "cancelled": lc.outcome(InvocationStatus.CANCELLED, code=ErrorCode.CANCELLED),
        "control_refused": _plain(
            EventType.CONTROL_REFUSED,
            {
                "invocation_id": lc.invocation_id,
                "tenant_id": "t_acme",
                "control_type": EventType.APPROVAL_GRANTED,
                "actor": "did:user:approver",
                "reason": "control event is not signed",
                "refused_event_id": "evt-forged",
            },
            source=Source.POLICY,
            invocationid=lc.invocation_id,
        ),
        "egress_allowed": _plain(
            EventType.EGRESS,
            {
                "invocation_id": lc.invocation_id,
                "tenant_id": "t_acme",
                "host": "api.example.com",
                "port": 443,
                "method": "CONNECT",
                "decision": "allowed",
                "reason": "granted",
                "address": "93.184.216.34",
                "at": "2025-01-01T12:00:03Z",
            },
        ),
        "egress_refused": _plain(
            EventType.EGRESS,
            {
                "invocation_id": lc.invocation_id,
                "tenant_id": "t_acme",
                "host": "10.0.0.1",
                "port": 80,
                "method": "GET",
                "decision": "refused",
                "reason": "private_address",
                "at": "2025-01-01T12:00:03Z",
            },
            id="evt-egress-refused",
        ),
        "circuit_opened": _plain(
            EventType.CIRCUIT_OPENED,
            {
                "circuit_name": "api.example",
                "state": "open",
                "reason": "5 failures",
                "retry_after_s": 30.0,
                "at": "2025-01-01T12:00:00Z",
            },
        ),
        "circuit_closed": _plain(
            EventType.CIRCUIT_CLOSED,
            {"circuit_name": "api.example", "state": "closed", "at": "2025-01-01T12:00:00Z"},
            tenantid=None,
            traceparent=None,
        ),
        "lifecycle_changed": _plain(
            EventType.TOOL_LIFECYCLE_CHANGED,
            {
                "tool_id": "core__echo",
                "tool_version": "1.0.0",
                "previous_state": "active",
                "lifecycle_state": "deprecated",
                "operator": "did:user:ops",
                "sunset_date": "2025-06-01T00:00:00Z",
                "deprecated_in_favor_of": "2.0.0",
                "at": "2025-01-01T12:00:00Z",
            },
            source=Source.API,
            authtype="app_user",
            authid="did:user:ops",
        ),
        "source_tool_added": _plain(
            EventType.SOURCE_TOOL_ADDED,
            {
                "source": "mcp-files",
                "source_tenant_id": "*",
                "tool_id": "mcp__read",
                "tool_version": "1.0.0",
                "enabled": False,
                "at": "2025-01-01T12:00:00Z",
            },
        ),
        "unknown_type": _plain("com.example.unknown", {"tool_id": "core__echo", "x": 1}),
        "no_time": _attrs(lc.invoked(), time=None),
        "time_with_offset": _attrs(
            lc.invoked(), time=datetime(2025, 1, 1, 14, 0, 0, 123_456, timezone(timedelta(hours=2)))
        ),
        "malformed": Envelope(
            id="x1",
            source="/somewhere",
            type=EventType.INVOKE_REQUESTED,
            tenantid="t1",
            data={"tool_id": 5, "parameters": "not a dict", "agent_context": "nope"},
        ),
        "malformed_terminal": _plain(
            EventType.FAILED,
            {
                "status": 7,
                "error": "not a dict",
                "agent_did": "",
                "tool_id": "t" * 600,
                "warnings": ["w1", 2, PII_TEXT, *(f"w{i}" for i in range(40))],
                "execution_metadata": {
                    "duration_ms": 12.5,
                    "attempts": "3",
                    "cached": None,
                    "started_at": ["a", 1],
                },
            },
        ),
        "odd_values": _with(
            lc.requested(),
            parameters={"level": Level.HIGH, 3: "int key", "tuple": (1, "a"), "set": {"x"}},
            execution_options={"priority": Level.HIGH, "require_approval": True},
            timeout_seconds=float("inf"),
            effect=float("nan"),
            requested_version=Level.HIGH,
        ),
        "odd_terminal": _with(
            lc.outcome(),
            execution_metadata={
                "duration_ms": Level.HIGH,
                "memory_peak_mb": float("-inf"),
                "truncated": True,
                "completed_at": "2025-01-01T12:00:05Z",
            },
        ),
        "surrogate": _with(lc.cancel_requested(), reason="lone \ud800 surrogate"),
    }
    # Services draw event ids at random: pinned, so the derived audit ids are too.
    return {name: _attrs(event, id=f"evt-{name}") for name, event in built.items()}


def wire(event: Envelope) -> Envelope:
    """``event`` as the audit worker decodes it (binary mode, as the pipeline sends it)."""
    message = encode(event)
    return decode(key=message.key, value=message.value, headers=message.headers)


def all_cases() -> dict[str, Envelope]:
    """:func:`cases`, each also as decoded from the wire (``<name>@wire``)."""
    out: dict[str, Envelope] = {}
    for name, event in cases().items():
        out[name] = event
        # Decoding stamps a missing time with the clock; a set never travels.
        if event.time is not None and name != "odd_values":
            out[f"{name}@wire"] = wire(event)
    return out


def rendered(audit: Envelope) -> dict[str, Any]:
    """What audit sends for one event: key, headers and value, its ``time`` pinned."""
    message = encode(audit.model_copy(update={"time": EMITTED}), ContentMode.STRUCTURED)
    return {
        "key": message.key.decode() if message.key is not None else None,
        "headers": [[name, value.decode()] for name, value in message.headers],
        "value": message.value.decode(),
    }


def expected() -> dict[str, dict[str, Any]]:
    return {
        name: rendered(audit_event(event, topic=TOPIC, now=NOW))
        for name, event in all_cases().items()
    }


def main() -> None:
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(expected(), indent=1, ensure_ascii=True, sort_keys=True)
    GOLDEN.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    main()
