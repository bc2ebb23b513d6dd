"""DLQ records keep a request's bytes but never its capability token (contract 9)."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolfleet.bus.dlq import (
    MARKER,
    REDACTED_HEADER,
    Redacted,
    dlq_message,
    redact_credentials,
)
from toolfleet.errors import ErrorCode, ErrorInfo
from toolfleet.events.codec import decode

pytestmark = pytest.mark.unit

FIELD = "capability_token"

names = st.text(max_size=8).filter(lambda name: name != FIELD)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(names, inner, max_size=4),
    max_leaves=20,
)
#: Any string a token field may hold: quotes, backslashes, control characters, unicode.
tokens = st.text(min_size=1, max_size=40).map(lambda text: "SECRET" + text)
b64url = st.text(
    alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", min_size=2
)
jwts = st.tuples(b64url, b64url, b64url).map(lambda parts: "eyJ" + ".".join(parts))


@st.composite
def dump_options(draw: st.DrawFn) -> dict[str, Any]:
    """How a producer may have written the JSON: the bytes kept are its own."""
    return {
        "indent": draw(st.sampled_from([None, 1, 2])),
        "separators": draw(st.sampled_from([(",", ":"), (", ", ": "), (",", " : ")])),
        "ensure_ascii": draw(st.booleans()),
    }


@st.composite
def requests(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """A request's ``data`` (maybe invalid) and where its token member goes."""
    data = draw(st.dictionaries(names, json_values, max_size=5))
    return data, draw(st.integers(min_value=0, max_value=len(data)))


def with_token(data: dict[str, Any], at: int, token: Any) -> dict[str, Any]:
    items = list(data.items())
    items.insert(at, (FIELD, token))
    return dict(items)


def dumps(value: Any, options: dict[str, Any]) -> bytes:
    return json.dumps(value, **options).encode()


@given(requests(), tokens, dump_options())
def test_binary_mode_keeps_every_byte_but_the_token(
    request: tuple[dict[str, Any], int], token: str, options: dict[str, Any]
) -> None:
    data, at = request
    value = dumps(with_token(data, at, token), options)
    redacted = redact_credentials(value)
    assert redacted.value == dumps(with_token(data, at, MARKER), options)
    assert redacted.replaced == ("data.capability_token",)


@given(requests(), tokens, dump_options(), st.booleans())
def test_structured_mode_keeps_every_byte_but_the_token(
    request: tuple[dict[str, Any], int], token: str, options: dict[str, Any], valid: bool
) -> None:
    data, at = request
    attributes = {"specversion": "1.0", "id": "e1"} if valid else {"type": 3}  # not an event

    def event(secret: str) -> dict[str, Any]:
        return {**attributes, "data": with_token(data, at, secret)}

    redacted = redact_credentials(dumps(event(token), options))
    assert redacted.value == dumps(event(MARKER), options)
    assert redacted.replaced == ("data.capability_token",)


def _markers(value: Any) -> Any:
    """The reference: every token member, at any depth, set to the marker."""
    if isinstance(value, dict):
        return {k: MARKER if k == FIELD else _markers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_markers(v) for v in value]
    return value


nested_with_tokens = st.recursive(
    st.none() | st.integers() | tokens,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from([FIELD, "data", "a"]) | names, inner, max_size=3)
    ),
    max_leaves=15,
)


@given(nested_with_tokens, dump_options())
def test_any_json_keeps_its_meaning_with_every_token_member_replaced(
    document: Any, options: dict[str, Any]
) -> None:
    value = dumps(document, options)
    redacted = redact_credentials(value)
    assert json.loads(redacted.value) == _markers(document)
    if redacted.replaced == ():
        assert redacted.value == value


@given(json_values, dump_options())
def test_json_without_a_token_is_kept_byte_for_byte(document: Any, options: dict[str, Any]) -> None:
    value = dumps(document, options)
    assert redact_credentials(value) == Redacted(value)


HOSTILE_SPELLINGS = [
    # A name the byte pattern cannot see, after or before the plain one: json keeps the last.
    b'{"capability\\u005ftoken": "SECRET-1", "capability_token": "SECRET-2"}',
    b'{"capability_token": "SECRET-2", "capability\\u005ftoken": "SECRET-1"}',
    b'{"capability_token": "SECRET-1", "capability_token": "SECRET-2"}',
    b'{"data": {"capability_token": {"jwt": "SECRET-1"}}}',
    b'{"capability_token": ["SECRET-1"], "data": {"capability_token": 1}}',
    b'{"data": {"capability_token" :\n "SECRET-1\\"\\\\SECRET-2"}}',
]


@pytest.mark.parametrize("value", HOSTILE_SPELLINGS)
def test_hostile_spellings_lose_every_token(value: bytes) -> None:
    redacted = redact_credentials(value)
    assert b"SECRET" not in redacted.value
    assert redacted.replaced == ("data.capability_token",)
    json.loads(redacted.value)


@given(st.binary(max_size=40), jwts, st.binary(max_size=40))
def test_a_value_that_is_not_json_loses_every_jwt_shaped_run(
    before: bytes, token: str, after: bytes
) -> None:
    value = b"\xff" + before + b" " + token.encode() + b" " + after
    redacted = redact_credentials(value)
    assert token.encode() not in redacted.value
    assert "jwt" in redacted.replaced
    if b"eyJ" not in before + after:
        assert redacted.value == b"\xff" + before + b" [redacted] " + after


def test_a_truncated_request_loses_its_token_member() -> None:
    value = b'{"tool_id": "core__echo", "capability_token": "opaque-SECRET", "parame'
    redacted = redact_credentials(value)
    assert redacted.value == b'{"tool_id": "core__echo", "capability_token": "[redacted]", "parame'
    assert redacted.replaced == ("data.capability_token",)


def _dlq(value: bytes, headers: list[tuple[str, bytes]]) -> tuple[dict[str, Any], dict[str, bytes]]:
    message = dlq_message(
        source="toolfleet/policy",
        consumer_group="policy",
        topic="toolfleet.invoke.requested",
        partition=0,
        offset=7,
        timestamp_ms=None,
        key=b"t1",
        headers=headers,
        value=value,
        error=ErrorInfo(code=ErrorCode.INVALID_EVENT, message="bad", retryable=False),
    )
    return json.loads(message.value)["data"], dict(message.headers)


def test_the_dlq_message_carries_the_redacted_value_and_says_so() -> None:
    token = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl"
    value = json.dumps({"invocation_id": str(uuid.uuid4()), FIELD: token}).encode()
    record, headers = _dlq(value, [("ce_id", b"1"), ("authorization", f"Bearer {token}".encode())])
    assert base64.b64decode(record["value_b64"]) == value.replace(token.encode(), MARKER.encode())
    kept = {h["key"]: base64.b64decode(h["value_b64"]) for h in record["headers"]}
    assert kept == {"ce_id": b"1", "authorization": b"Bearer [redacted]"}
    assert headers[REDACTED_HEADER] == b"data.capability_token,headers"


def test_a_record_without_a_token_is_dead_lettered_as_it_was() -> None:
    value = b'{"tool_id": 3}'
    record, headers = _dlq(value, [("ce_id", b"1")])
    assert base64.b64decode(record["value_b64"]) == value
    assert REDACTED_HEADER not in headers


@pytest.mark.parametrize("key", [b"\xed\xa0\x80", b"t1\x00", b"\xff"])
def test_a_key_that_names_no_tenant_is_kept_in_the_record_and_the_record_decodes(
    key: bytes,
) -> None:
    message = dlq_message(
        source="toolfleet/status",
        consumer_group="status",
        topic="toolfleet.invoke.requested",
        partition=0,
        offset=1,
        timestamp_ms=None,
        key=key,
        headers=[],
        value=b"{}",
        error=ErrorInfo(code=ErrorCode.INVALID_EVENT, message="bad", retryable=False),
    )
    assert message.key is None
    envelope = decode(key=message.key, value=message.value, headers=message.headers)
    assert base64.b64decode(envelope.data["key_b64"]) == key


def test_a_tenant_key_keys_the_dlq_record() -> None:
    message = dlq_message(
        source="toolfleet/status",
        consumer_group="status",
        topic="toolfleet.invoke.requested",
        partition=0,
        offset=1,
        timestamp_ms=None,
        key=b"t1",
        headers=[],
        value=b"{}",
        error=ErrorInfo(code=ErrorCode.INVALID_EVENT, message="bad", retryable=False),
    )
    assert message.key == b"t1"
