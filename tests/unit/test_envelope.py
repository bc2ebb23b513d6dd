"""Envelope construction: derived ids and the attributes every event must carry."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from toolfleet.errors import InvalidEvent
from toolfleet.events.envelope import (
    Envelope,
    _uuid_text,
    derived_event_id,
    new_event,
    random_event_id,
)
from toolfleet.events.types import EventType, Source

pytestmark = pytest.mark.unit

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def parent(**overrides: str) -> Envelope:
    values = {
        "id": "evt-1",
        "source": "/toolfleet/client",
        "type": EventType.INVOKE_REQUESTED.value,
        "tenantid": "t1",
        "partitionkey": "t1",
        "invocationid": "inv-1",
        "traceparent": TRACEPARENT,
        "tracestate": "vendor=1",
        "authtype": "app_user",
        "authid": "did:agent:x",
        **overrides,
    }
    return Envelope(**values)


def test_derived_id_is_deterministic_and_new() -> None:
    first = derived_event_id(parent(), EventType.INVOKE_AUTHORIZED)
    assert first == derived_event_id(parent(), EventType.INVOKE_AUTHORIZED)
    assert first != parent().id


@given(
    ids=st.lists(st.text(min_size=1, max_size=20), min_size=2, max_size=2, unique=True),
    source=st.sampled_from([s.value for s in Source]),
)
def test_derived_ids_differ_per_parent(ids: list[str], source: str) -> None:
    a, b = (parent(id=i, source=source) for i in ids)
    assert derived_event_id(a, "terminal") != derived_event_id(b, "terminal")
    assert derived_event_id(a, "terminal") not in ids


@given(
    event_id=st.text(min_size=1, max_size=40),
    source=st.text(min_size=1, max_size=40),
    salt=st.text(max_size=10),
)
def test_derived_ids_are_uuid5s_of_the_parent_type_and_salt(
    event_id: str, source: str, salt: str
) -> None:
    namespace = uuid.UUID("5b0e7a52-2f1c-4f4e-9a57-7c1f0de1f0a1")
    name = f"{source}\x1f{event_id}\x1f{EventType.INVOKED}\x1f{salt}"
    try:
        expected = str(uuid.uuid5(namespace, name))
    except UnicodeEncodeError:  # a lone surrogate: neither has an id for it
        with pytest.raises(UnicodeEncodeError):
            derived_event_id(parent(id=event_id, source=source), EventType.INVOKED, salt)
        return
    assert derived_event_id(parent(id=event_id, source=source), EventType.INVOKED, salt) == expected


@given(raw=st.binary(min_size=16, max_size=16), version=st.sampled_from([4, 5]))
def test_event_ids_are_written_as_the_uuid_module_writes_them(raw: bytes, version: int) -> None:
    assert _uuid_text(raw, version=version) == str(uuid.UUID(bytes=raw, version=version))


def test_random_event_ids_are_new_version_4_uuids() -> None:
    ids = {random_event_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(uuid.UUID(i).version == 4 and str(uuid.UUID(i)) == i for i in ids)


def test_derived_id_depends_on_type_salt_and_source() -> None:
    base = derived_event_id(parent(), EventType.INVOKED)
    assert base != derived_event_id(parent(), EventType.CHECKPOINT_CREATED)
    assert base != derived_event_id(parent(), EventType.INVOKED, "cp-1")
    assert base != derived_event_id(parent(source="/toolfleet/api"), EventType.INVOKED)


class Data(BaseModel):
    value: int


def test_new_event_carries_the_contract_attributes() -> None:
    event = new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data=Data(value=1),
        tenant_id="t1",
        invocation_id="inv-1",
        parent=parent(),
    )
    assert event.type == "ai.agent.tool.invoke.authorized"
    assert event.source == "/toolfleet/policy"
    assert event.partitionkey == event.tenantid == "t1"
    assert event.subject == event.invocationid == "inv-1"
    assert event.traceparent == TRACEPARENT
    assert event.tracestate == "vendor=1"
    assert (event.authtype, event.authid) == ("app_user", "did:agent:x")
    assert event.time is not None
    assert event.time.tzinfo is not None
    assert event.data == {"value": 1}
    assert event.id != parent().id


def test_new_event_explicit_context_wins_over_the_parent() -> None:
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    event = new_event(
        event_type=EventType.INVOKED,
        source=Source.EXECUTOR,
        data={},
        tenant_id="t1",
        invocation_id="inv-1",
        parent=parent(),
        traceparent=other,
        authid="someone",
        event_id="fixed",
    )
    assert event.traceparent == other
    assert event.authid == "someone"
    assert event.authtype == "app_user"
    assert event.id == "fixed"


def test_new_event_without_parent_or_invocation() -> None:
    event = new_event(
        event_type=EventType.CIRCUIT_OPENED,
        source=Source.EXECUTOR,
        data={"a": 1},
        tenant_id="t1",
        invocation_id=None,
    )
    assert event.subject is None
    assert event.invocationid is None
    assert event.traceparent is None
    assert event.authtype is None
    assert "subject" not in event.attributes()
    assert "data" not in event.attributes()


def test_dedupe_key_is_source_and_id() -> None:
    assert parent().dedupe_key == parent().dedupe_key
    assert parent().dedupe_key != parent(source="/other").dedupe_key
    assert parent().dedupe_key != parent(id="evt-2").dedupe_key


def test_data_as_turns_a_mismatch_into_invalid_event() -> None:
    assert parent().model_copy(update={"data": {"value": 3}}).data_as(Data) == Data(value=3)
    with pytest.raises(InvalidEvent) as caught:
        parent().model_copy(update={"data": {"value": "secret-ish"}}).data_as(Data)
    assert "secret-ish" not in str(caught.value.details)
