"""Envelope construction: derived ids and the attributes every event must carry."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from toolfleet.errors import InvalidEvent
from toolfleet.events.envelope import Envelope, derived_event_id, new_event
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
