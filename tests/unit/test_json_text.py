"""JSON text is read exactly: every integer JSON may hold, every escape Python can."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolfleet import json_text

pytestmark = pytest.mark.unit

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()  # unbounded: past 64 bits too
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_what_the_standard_library_writes_reads_back_equal(value: Any) -> None:
    text = json.dumps(value)
    assert json_text.loads(text) == value
    assert json_text.loads(text.encode()) == value


@pytest.mark.parametrize(
    "number", [2**64, 2**64 + 1, -(2**63) - 1, 10**19 + 7, -(10**30) - 3, 3**80]
)
def test_integers_past_64_bits_stay_exact_integers(number: int) -> None:
    value = json_text.loads(f'{{"n": [{number}]}}'.encode())
    assert value == {"n": [number]}
    assert type(value["n"][0]) is int


def test_integers_at_the_edges_of_64_bits_and_floats_read_as_they_are() -> None:
    text = f"[{2**64 - 1}, {-(2**63)}, 0.1, 1e300, 123456789012345678]"
    assert json_text.loads(text) == [2**64 - 1, -(2**63), 0.1, 1e300, 123456789012345678]


def test_a_lone_surrogate_escape_is_read() -> None:
    assert json_text.loads(b'{"a": "\\ud800"}') == {"a": "\ud800"}


@pytest.mark.parametrize("text", [b"{", b"", b"[1,]", b"\xff", "{'a': 1}"])
def test_what_is_not_json_raises_a_value_error(text: bytes | str) -> None:
    with pytest.raises((json.JSONDecodeError, UnicodeDecodeError)):
        json_text.loads(text)
