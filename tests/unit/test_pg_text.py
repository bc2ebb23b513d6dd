"""The lossless Postgres text codec: whatever goes in comes back, and what is stored is
text Postgres accepts (no NUL, no surrogate)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from toolfleet.storage.pg_text import (
    ESCAPE,
    decode_json,
    encode_json,
    escape_array,
    escape_json,
    escape_text,
    jsonable,
    unescape_array,
    unescape_json,
    unescape_text,
)

pytestmark = pytest.mark.unit

# Text weighted towards what the codec must handle: NUL, surrogates, the escape
# character, and what an escape looks like (so a plain "e0000000" cannot be mistaken).
tricky = st.text(
    alphabet=st.one_of(
        st.characters(codec=None),
        st.sampled_from(["\x00", ESCAPE, "\ud800", "\udfff", "0", "e", "f", "\\", "u"]),
    ),
    max_size=40,
)
json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | tricky
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky, inner, max_size=4),
    max_leaves=20,
)


def storable(text: str) -> bool:
    """What Postgres accepts in ``text`` and in ``jsonb`` strings."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


@given(tricky)
def test_text_round_trips_through_storable_text(text: str) -> None:
    stored = escape_text(text)
    assert storable(stored)
    assert unescape_text(stored) == text


@given(st.text(alphabet=st.characters(exclude_characters="\x00\ue000", codec="utf-8")))
def test_storable_text_is_stored_unchanged(text: str) -> None:
    assert escape_text(text) == text
    assert unescape_text(text) == text


def test_escapes_are_readable_and_the_escape_character_escapes_itself() -> None:
    assert escape_text("a\x00b") == f"a{ESCAPE}0000b"
    assert escape_text("\ud800") == f"{ESCAPE}d800"
    assert escape_text(f"{ESCAPE}0000") == f"{ESCAPE}e0000000"
    assert unescape_text(f"{ESCAPE}e0000000") == f"{ESCAPE}0000"


REFUSED_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u(?:0000|d[89a-f])", re.IGNORECASE)


@given(json_value)
def test_json_round_trips_and_postgres_accepts_it(value: Any) -> None:
    text = encode_json(value)
    assert storable(text)
    # jsonb refuses \u0000 and lone-surrogate escapes inside strings as well. An escape
    # is a backslash not itself escaped: "\\u0000" (a literal backslash, then u0000) is fine.
    assert not REFUSED_ESCAPE.search(text)
    assert decode_json(text) == value


def test_json_with_ascii_escapes_of_the_escape_character_decodes() -> None:
    # What a ``json`` (not jsonb) column returns when its input used ASCII escapes.
    written = json.dumps({"k": escape_text("a\x00")}, ensure_ascii=True)
    assert decode_json(written) == {"k": "a\x00"}


@given(st.lists(st.none() | tricky, max_size=6))
def test_arrays_round_trip(values: list[str | None]) -> None:
    stored = escape_array(values)
    assert all(v is None or storable(v) for v in stored)
    assert unescape_array(stored) == values
    assert unescape_array(None) is None


class _Holder(BaseModel):
    details: dict[str, Any]
    items: list[Any]


@given(st.dictionaries(tricky, json_value, max_size=4), st.lists(json_value, max_size=3))
def test_jsonable_keeps_every_text_as_sent(details: dict[str, Any], items: list[Any]) -> None:
    model = _Holder(details=details, items=items)
    # What it gives is what the escaping serializer pass gives, surrogates and NUL kept.
    escaped = unescape_json(to_jsonable_python(escape_json(model.model_dump())))
    assert jsonable(model) == escaped
    assert jsonable(model) == {"details": details, "items": items}
    assert decode_json(encode_json(jsonable(model))) == escaped
