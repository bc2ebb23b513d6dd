"""The audit fast path equals the implementation it replaced, on random events.

``tests/support/audit_reference.py`` keeps the record building from before (pydantic
models validated and dumped back). Random lifecycle events, read as leniently as audit
reads them (odd types, numbers JSON cannot hold, enums, secrets in free text), must give
the same audit event, attribute for attribute and byte for byte, or the same error.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from enum import IntEnum, StrEnum
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from tests.support import audit_reference
from tests.support.audit_golden import GOLDEN, NOW, PII_TEXT, TOPIC, all_cases, rendered
from tests.unit.test_events_sanitize import planted_secrets
from toolfleet.audit.records import _json_time, audit_event
from toolfleet.events.envelope import Envelope, derived_event_id
from toolfleet.events.types import EventType, Source

pytestmark = pytest.mark.unit


class Level(IntEnum):
    LOW = 1


class Colour(StrEnum):
    RED = "red"


_TIMEZONES = [
    UTC,
    timezone(timedelta(hours=2)),
    timezone(timedelta(hours=-5, minutes=-30)),
    timezone(timedelta(seconds=30)),
    ZoneInfo("Europe/London"),
    ZoneInfo("America/New_York"),
]
moments = st.datetimes(
    min_value=datetime(1970, 1, 2),
    timezones=st.one_of(st.none(), st.sampled_from(_TIMEZONES)),
)
texts = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["success", "error", "allowed", "refused", "", PII_TEXT, "x" * 600]),
    planted_secrets,
    moments.map(lambda m: m.isoformat()),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    texts,
    st.just(Level.LOW),
    st.just(Colour.RED),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(texts, st.integers()), children, max_size=4),
    ),
    max_leaves=12,
)


def _member(keys: list[str], extra: st.SearchStrategy[Any] = values) -> st.SearchStrategy[Any]:
    return st.one_of(values, st.dictionaries(st.sampled_from(keys), extra, max_size=len(keys)))


_META_KEYS = [
    "duration_ms",
    "cpu_used_millicore_seconds",
    "memory_peak_mb",
    "attempts",
    "cached",
    "truncated",
    "started_at",
    "completed_at",
    "resumed_from_checkpoint_id",
]
_DATA_KEYS = [
    "invocation_id",
    "tenant_id",
    "agent_did",
    "tool_id",
    "tool_version",
    "status",
    "decision",
    "approver",
    "requested_by",
    "actor",
    "operator",
    "attempt",
    "started_at",
    "requested_version",
    "effect",
    "timeout_seconds",
    "worker_id",
    "checkpoint_id",
    "checkpoint_type",
    "progress_percent",
    "current_phase",
    "resumed_from_checkpoint_id",
    "reason",
    "control_type",
    "refused_event_id",
    "circuit_name",
    "state",
    "lifecycle_state",
    "previous_state",
    "sunset_date",
    "deprecated_in_favor_of",
    "retry_after_s",
    "expires_at",
    "warnings",
    "capability_token",
]
members = st.fixed_dictionaries(
    {},
    optional={
        **dict.fromkeys(_DATA_KEYS, values),
        "agent_context": _member(["agent_did", "user_did", "tenant_id"], texts),
        "parameters": st.one_of(values, st.dictionaries(texts, values, max_size=6)),
        "execution_metadata": _member(_META_KEYS),
        "execution_options": _member(["priority", "require_approval", "idempotency_key"]),
        "error": _member(["code", "message", "retryable"]),
        "documents_accessed": st.one_of(
            st.none(),
            st.lists(
                st.one_of(
                    values,
                    st.dictionaries(st.sampled_from(["document_id", "version", "access"]), texts),
                ),
                max_size=3,
            ),
        ),
    },
)
event_types = st.one_of(st.sampled_from([t.value for t in EventType]), st.just("com.example.x"))
optional_text = st.one_of(st.none(), st.text(min_size=1, max_size=12))
traceparents = st.one_of(
    st.none(),
    st.builds(
        lambda t, p: f"00-{t:032x}-{p:016x}-01",
        st.integers(0, 2**128 - 1),
        st.integers(0, 2**64 - 1),
    ),
    st.text(max_size=60),
)


@st.composite
def envelopes(draw: st.DrawFn) -> Envelope:
    """A lifecycle event as audit may receive it (drawn in steps: a short repr)."""
    return Envelope(
        id=draw(st.one_of(st.uuids().map(str), st.text(min_size=1, max_size=40))),
        source=draw(st.sampled_from([s.value for s in Source] + ["/elsewhere"])),
        type=draw(event_types),
        time=draw(st.one_of(st.none(), moments)),
        tenantid=draw(optional_text),
        invocationid=draw(st.one_of(optional_text, st.uuids().map(str))),
        traceparent=draw(traceparents),
        tracestate=draw(optional_text),
        authtype=draw(optional_text),
        authid=draw(optional_text),
        data=draw(members),
    )


EMITTED = datetime(2025, 1, 1, 13, 0, 1, tzinfo=UTC)


def _outcome(build: Any, event: Envelope) -> Any:
    try:
        audit = build(event, topic=TOPIC, now=NOW).model_copy(update={"time": EMITTED})
    except Exception as exc:  # the reference's own failure is the expected one
        return type(exc)
    try:
        wire = rendered(audit)
    except TypeError:
        wire = None  # data orjson and json cannot write either way: compared as objects
    return audit, audit.model_fields_set, wire


@given(event=envelopes())
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_events_audit_as_before(event: Envelope) -> None:
    assert _outcome(audit_event, event) == _outcome(audit_reference.audit_event, event)


def test_the_reference_still_writes_the_golden_file() -> None:
    import json

    pinned = json.loads(GOLDEN.read_text(encoding="utf-8"))
    for name, event in all_cases().items():
        assert rendered(audit_reference.audit_event(event, topic=TOPIC, now=NOW)) == pinned[name]


@given(
    event=st.builds(
        Envelope,
        id=st.text(min_size=1, max_size=40),
        source=st.text(min_size=1, max_size=40),
        type=st.one_of(event_types, st.text(min_size=1, max_size=40)),
    )
)
@settings(max_examples=300, deadline=None)
def test_audit_ids_are_derived_event_ids(event: Envelope) -> None:
    audit = audit_event(event, topic=TOPIC, now=NOW)
    assert audit.id == derived_event_id(event, event.type)
    assert uuid.UUID(audit.id).version == 5


@given(moment=st.datetimes(timezones=st.one_of(st.none(), st.sampled_from(_TIMEZONES))))
@settings(max_examples=500, deadline=None)
def test_times_are_written_as_pydantic_writes_them(moment: datetime) -> None:
    assert _json_time(moment) == TypeAdapter(datetime).dump_python(moment, mode="json")
