"""The Kafka binding: both content modes round-trip; anything else is an InvalidEvent."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from cloudevents.core.bindings import kafka as ce_kafka
from cloudevents.core.formats.json import JSONFormat
from cloudevents.core.v1.event import CloudEvent
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet.errors import InvalidEvent
from toolfleet.events.codec import (
    STRUCTURED_CONTENT_TYPE,
    ContentMode,
    _header_attributes,
    _header_attributes_in_general,
    decode,
    encode,
)
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


# --- the lean codec speaks the cloudevents SDK's binding, both ways ---------------------

_SDK_FORMAT = JSONFormat()


def _sdk_encode(envelope: Envelope, mode: ContentMode) -> ce_kafka.KafkaMessage:
    event = CloudEvent(attributes=envelope.attributes(), data=envelope.data)
    if mode is ContentMode.BINARY:
        return ce_kafka.to_binary(event, _SDK_FORMAT)
    return ce_kafka.to_structured(event, _SDK_FORMAT)


@settings(max_examples=100, deadline=None)
@given(envelope=envelopes(), mode=st.sampled_from(list(ContentMode)))
def test_messages_the_sdk_writes_decode_to_the_same_envelope(
    envelope: Envelope, mode: ContentMode
) -> None:
    message = _sdk_encode(envelope, mode)
    key = message.key.encode() if isinstance(message.key, str) else message.key
    assert decode(key=key, value=message.value, headers=list(message.headers.items())) == envelope


@settings(max_examples=100, deadline=None)
@given(envelope=envelopes(), mode=st.sampled_from(list(ContentMode)))
def test_the_sdk_reads_what_the_codec_writes(envelope: Envelope, mode: ContentMode) -> None:
    ours = encode(envelope, mode)
    theirs = _sdk_encode(envelope, mode)
    assert dict(ours.headers) == theirs.headers
    assert json.loads(ours.value) == json.loads(theirs.value)
    message = ce_kafka.KafkaMessage(headers=dict(ours.headers), key=ours.key, value=ours.value)
    read = (
        ce_kafka.from_binary(message, _SDK_FORMAT)
        if mode is ContentMode.BINARY
        else ce_kafka.from_structured(message, _SDK_FORMAT)
    )
    attributes = read.get_attributes()
    assert attributes["id"] == envelope.id
    assert attributes["time"] == envelope.time
    assert read.get_data() == envelope.data


def test_an_event_without_time_is_stamped_when_encoded_and_when_decoded() -> None:
    binary = encode(_sample(time=None), ContentMode.BINARY)
    assert "ce_time" in dict(binary.headers)
    headers = [(k, v) for k, v in binary.headers if k != "ce_time"]
    assert decode(key=binary.key, value=binary.value, headers=headers).time is not None


def test_integers_past_64_bits_survive_both_modes() -> None:
    # Just past each end of 64 bits, and values no float holds exactly.
    big = {"n": 2**64 + 1, "m": -(2**63) - 1, "k": [3**50, -(3**50)], "u": 2**64 - 1}
    for mode in ContentMode:
        message = encode(_sample(data=big), mode)
        assert decode(key=message.key, value=message.value, headers=message.headers).data == big


def test_text_with_a_lone_surrogate_survives_both_modes() -> None:
    # JSON may carry "\ud800" (a producer sent it); UTF-8 cannot, so it travels escaped.
    lone = {"message": "a\ud800b", "nested": ["\udfff", {"k": "é\ud83d"}]}
    for mode in ContentMode:
        message = encode(_sample(data=lone), mode)
        message.value.decode("utf-8")  # the wire stays valid UTF-8
        assert decode(key=message.key, value=message.value, headers=message.headers).data == lone


@pytest.mark.parametrize(
    "header", [("ce_time", b"2025-01-01T00:00:00"), ("ce_subject", b""), ("ce_id", b"")]
)
def test_attributes_the_spec_refuses_are_invalid(header: tuple[str, bytes]) -> None:
    binary = encode(_sample(subject="i1"), ContentMode.BINARY)
    headers = [(k, v) for k, v in binary.headers if k != header[0]] + [header]
    with pytest.raises(InvalidEvent):
        decode(key=binary.key, value=binary.value, headers=headers)


def test_undecodable_header_bytes_are_invalid() -> None:
    binary = encode(_sample(), ContentMode.BINARY)
    with pytest.raises(InvalidEvent):
        decode(key=binary.key, value=binary.value, headers=[*binary.headers, ("ce_x", b"\xff")])


def test_structured_binary_data_is_not_a_json_object() -> None:
    event = json.loads(encode(_sample(), ContentMode.STRUCTURED).value)
    del event["data"]
    event["data_base64"] = "AAEC"
    with pytest.raises(InvalidEvent, match="JSON object"):
        decode(
            key=b"t1",
            value=json.dumps(event).encode(),
            headers=[("content-type", STRUCTURED_CONTENT_TYPE.encode())],
        )


def test_binary_headers_in_any_case_decode_like_lower_case() -> None:
    binary = encode(_sample(subject="i1"), ContentMode.BINARY)
    shouted = [(name.upper(), value) for name, value in binary.headers]
    assert decode(key=binary.key, value=binary.value, headers=shouted) == _sample(subject="i1")


def test_a_repeated_binary_header_takes_its_last_value() -> None:
    binary = encode(_sample(), ContentMode.BINARY)
    headers = [*binary.headers, ("CE_SUBJECT", b"first"), ("ce_subject", b"last")]
    assert decode(key=binary.key, value=binary.value, headers=headers).subject == "last"


def test_a_structured_content_type_after_another_decides_the_mode() -> None:
    structured = encode(_sample(id="from-value"), ContentMode.STRUCTURED)
    headers = [
        ("content-type", b"application/json"),
        ("ce_id", b"\xff not text"),  # a stray header is never read in structured mode
        *structured.headers,
    ]
    assert decode(key=b"t1", value=structured.value, headers=headers).id == "from-value"


@pytest.mark.parametrize("name", ["ce_subject", "ce_comexampleext", "content-type"])
def test_a_header_without_a_value_is_invalid_not_a_crash(name: str) -> None:
    binary = encode(_sample(), ContentMode.BINARY)
    headers: list[tuple[str, bytes | None]] = [*binary.headers, (name, None)]
    with pytest.raises(InvalidEvent, match="undecodable binary"):
        decode(key=binary.key, value=binary.value, headers=headers)


def test_an_undecodable_header_replaced_by_a_later_one_of_its_name_decodes() -> None:
    binary = encode(_sample(), ContentMode.BINARY)
    headers = [*binary.headers, ("ce_subject", b"\xff"), ("CE_SUBJECT", b"later")]
    assert decode(key=binary.key, value=binary.value, headers=headers).subject == "later"


_HEADER_NAMES = st.sampled_from(
    [
        "ce_id",
        "ce_source",
        "ce_type",
        "ce_specversion",
        "ce_time",
        "ce_tenantid",
        "ce_traceparent",
        "content-type",
        "Content-Type",
        "CE_ID",
        "ce_data",
        "ce_unknownext",
        "x-other",
    ]
)
_HEADER_VALUES = st.one_of(
    st.none(),
    st.sampled_from(
        [
            b"application/json",
            b"application/cloudevents+json",
            b"Application/CloudEvents+JSON; charset=utf-8",
            b"text/plain",
            b"\xff\xfe",
            b"",
        ]
    ),
    st.binary(max_size=8),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_HEADER_NAMES, _HEADER_VALUES), max_size=8))
def test_headers_as_toolfleet_writes_them_read_as_any_headers_are_read(
    headers: list[tuple[str, bytes | None]],
) -> None:
    def reading(read: Any) -> object:
        try:
            return read(headers)
        except InvalidEvent as exc:
            return ("refused", str(exc))

    assert reading(_header_attributes) == reading(_header_attributes_in_general)
