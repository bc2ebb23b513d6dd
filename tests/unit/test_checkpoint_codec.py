"""Durable checkpoint encoding: deltas and compression always read back exactly."""

from __future__ import annotations

import copy
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolfleet.executor.checkpoints.codec import (
    apply_patch,
    canonical_json,
    decode,
    diff,
    encode,
)

pytestmark = pytest.mark.unit

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
# Keys with the characters JSON Pointer escapes, and the empty key.
keys = st.sampled_from(["", "a", "b", "a/b", "~", "~1", "0", "-"]) | st.text(max_size=6)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=5),
    max_leaves=25,
)
states = st.dictionaries(keys, json_value, max_size=6)


def same(a: Any, b: Any) -> bool:
    """JSON equality, strict about 1 / 1.0 / true and -0.0."""
    return canonical_json(a) == canonical_json(b)


@st.composite
def related(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any]]:
    """A parent and a child made from it by a few edits (the usual checkpoint history)."""
    parent = draw(states)
    child = copy.deepcopy(parent)
    for _ in range(draw(st.integers(0, 4))):
        edit = draw(st.sampled_from(["set", "drop", "null", "nest"]))
        key = draw(keys)
        if edit == "set":
            child[key] = draw(json_value)
        elif edit == "drop" and child:
            child.pop(draw(st.sampled_from(sorted(child))))
        elif edit == "null":
            child[key] = None
        else:
            child[key] = {"inner": child.get(key), "list": [draw(json_leaf), None]}
    return parent, child


@settings(max_examples=150)
@given(st.one_of(st.tuples(states, states), related()), st.integers(0, 64), st.integers(0, 64))
def test_decode_of_encode_is_the_state(
    pair: tuple[dict[str, Any], dict[str, Any]], delta_min: int, compress_min: int
) -> None:
    parent, child = pair
    before = canonical_json(parent)
    encoded = encode(child, parent, delta_min_bytes=delta_min, compress_min_bytes=compress_min)
    assert same(decode(encoded.payload, encoded.encoding, parent), child)
    assert canonical_json(parent) == before  # the parent is never modified


@settings(max_examples=150)
@given(json_value, json_value)
def test_patch_of_diff_turns_old_into_new(old: Any, new: Any) -> None:
    assert same(apply_patch(old, diff(old, new)), new)


@given(states)
def test_a_state_without_parent_is_stored_whole(state: dict[str, Any]) -> None:
    encoded = encode(state, None, delta_min_bytes=0, compress_min_bytes=10**9)
    assert encoded.encoding == "json"
    assert encoded.payload == canonical_json(state)
    assert same(decode(encoded.payload, "json", None), state)


def test_nulls_nested_lists_and_removed_keys() -> None:
    parent = {
        "keep": {"deep": [1, 2, {"x": None}], "gone": True},
        "drop": "me",
        "n": None,
        "a/b": {"~": 1},
        "": [0, 1, 2, 3],
    }
    child = {
        "keep": {"deep": [1, None, {"x": 0}, [], {}]},
        "n": None,
        "new": None,
        "a/b": {"~": 1.0},
        "": [0],
    }
    patch = diff(parent, child)
    assert {"op": "remove", "path": "/drop"} in patch
    assert {"op": "replace", "path": "/a~1b/~0", "value": 1.0} in patch
    assert same(apply_patch(parent, patch), child)
    assert diff(child, child) == []


def test_a_large_state_is_a_compressed_delta() -> None:
    parent = {"rows": [{"id": i, "text": f"row {i} " * 8} for i in range(200)], "cursor": 0}
    child = copy.deepcopy(parent)
    child["cursor"] = 200
    child["rows"].append({"id": 200, "text": None})
    encoded = encode(child, parent, delta_min_bytes=4096, compress_min_bytes=64)
    assert encoded.encoding == "delta+zlib"
    assert len(encoded.payload) < 200
    assert same(decode(encoded.payload, encoded.encoding, parent), child)


def test_thresholds_pick_the_encoding() -> None:
    parent = {"blob": "x" * 5000}
    child = {"blob": "x" * 5000, "more": 1}
    small = {"a": 1}
    assert encode(small, parent, delta_min_bytes=4096, compress_min_bytes=1024).encoding == "json"
    assert encode(child, parent, delta_min_bytes=4096, compress_min_bytes=10**6).encoding == (
        "delta"
    )
    assert encode(child, None, delta_min_bytes=4096, compress_min_bytes=1024).encoding == (
        "json+zlib"
    )
    # A delta as large as the state itself is not worth a chain link.
    other = {"blob": "y" * 5000}
    assert encode(other, parent, delta_min_bytes=0, compress_min_bytes=10**6).encoding == "json"


def test_bad_input_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="unknown"):
        decode(b"{}", "msgpack", None)
    with pytest.raises(ValueError, match="parent"):
        decode(b"[]", "delta", None)
    with pytest.raises(zlib.error):
        decode(b"not zlib", "json+zlib", None)
    with pytest.raises(ValueError, match="no member"):
        apply_patch({"a": 1}, [{"op": "remove", "path": "/b"}])
    with pytest.raises(ValueError, match="bad array index"):
        apply_patch({"a": [1]}, [{"op": "replace", "path": "/a/01", "value": 2}])
    with pytest.raises(ValueError, match="unsupported"):
        apply_patch({"a": 1}, [{"op": "move", "path": "/a", "from": "/b"}])
