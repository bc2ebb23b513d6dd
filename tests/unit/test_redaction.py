"""The redaction allowlist keeps the result's shape and hides everything else."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolfleet.registry.redaction import REDACTED, redact

pytestmark = pytest.mark.unit

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=25,
)


def test_paths_and_subtrees() -> None:
    result = {"a": 1, "b": {"c": 2, "d": [{"e": 3, "f": 4}]}, "g": {"h": 5}}
    assert redact(result, ["a", "b.d.e", "g"]) == {
        "a": 1,
        "b": {"c": REDACTED, "d": [{"e": 3, "f": REDACTED}]},
        "g": {"h": 5},
    }


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6))
def test_empty_allowlist_leaks_no_leaf(result: dict[str, Any]) -> None:
    out = redact(result, [])
    leaves: list[Any] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        else:
            leaves.append(v)

    walk(out)
    assert all(leaf == REDACTED for leaf in leaves)
    assert set(out) == set(result)  # shape kept


@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: "." not in k), json_values, max_size=6
    )
)
def test_allowing_every_top_level_field_is_identity(result: dict[str, Any]) -> None:
    assert json.dumps(redact(result, list(result)), sort_keys=True) == json.dumps(
        result, sort_keys=True
    )
