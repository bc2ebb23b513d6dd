"""``-p key=value`` and ``--params-json`` parsing."""

from __future__ import annotations

import pytest

from toolfleet.cli.errors import CliError
from toolfleet.cli.params import parse_params, parse_value

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5", 5),
        ("2.5", 2.5),
        ("true", True),
        ("null", None),
        ('"5"', "5"),
        ("[1, 2]", [1, 2]),
        ('{"a": 1}', {"a": 1}),
        ("hi", "hi"),
        ("hello world", "hello world"),
        ("007", "007"),
        ("", ""),
        ("a=b", "a=b"),
    ],
)
def test_values_are_json_when_valid_json(text: str, expected: object) -> None:
    assert parse_value(text) == expected


def test_pairs() -> None:
    assert parse_params(["steps=5", "message=hi", "step_seconds=0.1"]) == {
        "steps": 5,
        "message": "hi",
        "step_seconds": 0.1,
    }


def test_only_the_first_equals_splits() -> None:
    assert parse_params(["query=a=b"]) == {"query": "a=b"}


def test_params_json_merges_and_pairs_win() -> None:
    merged = parse_params(["steps=3"], '{"steps": 1, "step_seconds": 0.5}')
    assert merged == {"steps": 3, "step_seconds": 0.5}


def test_no_params() -> None:
    assert parse_params([]) == {}


@pytest.mark.parametrize("pair", ["novalue", "=5", " =x"])
def test_malformed_pair(pair: str) -> None:
    with pytest.raises(CliError, match="key=value"):
        parse_params([pair])


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", "5"])
def test_params_json_must_be_an_object(text: str) -> None:
    with pytest.raises(CliError, match="--params-json"):
        parse_params([], text)
