"""The Kafka binding: both content modes round-trip; anything else is an InvalidEvent."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet.errors import InvalidEvent
from toolfleet.events.codec import STRUCTURED_CONTENT_TYPE, ContentMode, decode, encode
from toolfleet.events.envelope import Envelope
from toolfleet.events.types import EventType

pytestmark = pytest.mark.unit

attribute_text = st.text(min_size=1, max_size=64)
json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=32)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
times = st.datetimes(
    min_value=datetime(1970, 1, 2),
    max_value=datetime(2200, 1, 1),
    timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30))]),
)


@st.composite
def envelopes(draw: st.DrawFn) -> Envelope:
    optional = {
        name: draw(st.none() | attribute_text)
        for name in (
            "subject",
            "tenantid",
            "invocationid",
            "partitionkey",
            "traceparent",
            "tracestate",
            "authtype",
            "authid",
        )
    }
    return Envelope(
        id=draw(attribute_text),
        source=draw(st.sampled_from(["/toolfleet/policy", "/toolfleet/client"]) | attribute_text),
        type=draw(st.sampled_from([t.value for t in EventType]) | attribute_text),
        time=draw(times),  # the SDK stamps a time on events that lack one
        data=draw(st.dictionaries(st.text(max_size=16), json_value, max_size=6)),
        **optional,
    )


def _decode(message: Any) -> Envelope:
    return decode(key=message.key, value=message.value, headers=message.headers)


@settings(max_examples=200, deadline=None)
@given(envelope=envelopes(), mode=st.sampled_from(list(ContentMode)))
def test_round_trip(envelope: Envelope, mode: ContentMode) -> None:
    message = encode(envelope, mode)
    assert _decode(message) == envelope
    assert message.key == (envelope.partitionkey.encode() if envelope.partitionkey else None)


def _sample(**overrides: Any) -> Envelope:
    values: dict[str, Any] = {
        "id": "e1",
        "source": "/toolfleet/client",
        "type": EventType.INVOKE_REQUESTED.value,
        "time": datetime(2025, 1, 1, tzinfo=UTC),
        "tenantid": "t1",
        "partitionkey": "t1",
        "invocationid": "i1",
        "data": {"a": 1},
    }
    return Envelope(**{**values, **overrides})


def test_binary_mode_uses_ce_headers_and_structured_mode_a_content_type() -> None:
    binary = encode(_sample(), ContentMode.BINARY)
    names = {name for name, _ in binary.headers}
    assert {"ce_id", "ce_source", "ce_type", "ce_specversion", "ce_tenantid"} <= names
    assert json.loads(binary.value) == {"a": 1}
    structured = encode(_sample(), ContentMode.STRUCTURED)
    assert structured.headers == [("content-type", STRUCTURED_CONTENT_TYPE.encode())]
    assert json.loads(structured.value)["data"] == {"a": 1}


def test_no_ce_headers_and_no_content_type_is_not_a_cloudevent() -> None:
    with pytest.raises(InvalidEvent, match="not a CloudEvent"):
        decode(key=b"t1", value=b'{"a": 1}', headers=[("x-other", b"1")])


def test_plain_json_content_type_without_ce_headers_is_not_a_cloudevent() -> None:
    with pytest.raises(InvalidEvent):
        decode(key=None, value=b"{}", headers=[("content-type", b"application/json")])


@pytest.mark.parametrize("mode", list(ContentMode))
def test_bad_json_is_invalid(mode: ContentMode) -> None:
    message = encode(_sample(), mode)
    with pytest.raises(InvalidEvent):
        decode(key=message.key, value=b"{not json", headers=message.headers)


@pytest.mark.parametrize("data", [b"[1, 2]", b'"text"', b"42"])
def test_binary_data_must_be_an_object(data: bytes) -> None:
    message = encode(_sample(), ContentMode.BINARY)
    with pytest.raises(InvalidEvent):
        decode(key=message.key, value=data, headers=message.headers)


@pytest.mark.parametrize("data", [[1, 2], "text", 42])
def test_structured_data_must_be_an_object(data: object) -> None:
    event = json.loads(encode(_sample(), ContentMode.STRUCTURED).value)
    event["data"] = data
    with pytest.raises(InvalidEvent):
        decode(
            key=b"t1",
            value=json.dumps(event).encode(),
            headers=[("content-type", STRUCTURED_CONTENT_TYPE.encode())],
        )


def test_wrong_specversion_is_invalid_in_both_modes() -> None:
    binary = encode(_sample(), ContentMode.BINARY)
    headers = [(k, b"0.3" if k == "ce_specversion" else v) for k, v in binary.headers]
    with pytest.raises(InvalidEvent):
        decode(key=binary.key, value=binary.value, headers=headers)
    event = json.loads(encode(_sample(), ContentMode.STRUCTURED).value)
    event["specversion"] = "2.0"
    with pytest.raises(InvalidEvent):
        decode(
            key=b"t1",
            value=json.dumps(event).encode(),
            headers=[("content-type", STRUCTURED_CONTENT_TYPE.encode())],
        )


def test_missing_required_attribute_is_invalid() -> None:
    event = json.loads(encode(_sample(), ContentMode.STRUCTURED).value)
    del event["source"]
    with pytest.raises(InvalidEvent):
        decode(
            key=b"t1",
            value=json.dumps(event).encode(),
            headers=[("content-type", STRUCTURED_CONTENT_TYPE.encode())],
        )


@pytest.mark.parametrize("stray_first", [True, False])
def test_structured_message_with_stray_ce_headers_decodes_as_structured(
    stray_first: bool,
) -> None:
    structured = encode(_sample(id="from-value"), ContentMode.STRUCTURED)
    stray = [("ce_id", b"from-header"), ("ce_source", b"/elsewhere"), ("ce_type", b"x.y")]
    headers = stray + structured.headers if stray_first else structured.headers + stray
    # Whatever the order, the content type decides, and the value wins over ce_ headers.
    envelope = decode(key=b"t1", value=structured.value, headers=headers)
    assert envelope.id == "from-value"
    assert envelope.source == "/toolfleet/client"
    assert envelope.data == {"a": 1}


def test_structured_content_type_with_parameters_and_case() -> None:
    structured = encode(_sample(), ContentMode.STRUCTURED)
    headers = [("Content-Type", b"Application/CloudEvents+JSON; charset=utf-8")]
    assert decode(key=b"t1", value=structured.value, headers=headers) == _sample()


def test_unknown_extensions_are_dropped() -> None:
    binary = encode(_sample(), ContentMode.BINARY)
    envelope = decode(
        key=binary.key, value=binary.value, headers=[*binary.headers, ("ce_comexampleext", b"v")]
    )
    assert envelope == _sample()


def test_empty_binary_value_is_empty_data() -> None:
    binary = encode(_sample(data={}), ContentMode.BINARY)
    assert decode(key=binary.key, value=None, headers=binary.headers).data == {}
