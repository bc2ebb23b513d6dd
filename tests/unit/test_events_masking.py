"""Redaction of parameters: planted secrets never survive, harmless values do."""

from __future__ import annotations

import json
import string
from typing import Any

import jwt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolfleet.events.masking import (
    MAX_DEPTH,
    MAX_ITEMS,
    MAX_STRING,
    REDACTED,
    TRUNCATED,
    is_secret_key,
    mask_parameters,
    mask_text,
    mask_value,
)

pytestmark = pytest.mark.unit

# --- strategies ----------------------------------------------------------------------

#: No a-f (no hex runs), no digits, no '@': text built from it can never look sensitive.
_SAFE_ALPHABET = "ghijklmnopqrstuvwxyz _"
safe_text = st.text(alphabet=_SAFE_ALPHABET, max_size=24)
safe_keys = st.text(alphabet=_SAFE_ALPHABET, min_size=1, max_size=12).filter(
    lambda k: not is_secret_key(k)
)
safe_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-1_000_000, max_value=1_000_000),
    st.floats(allow_nan=False, allow_infinity=False),
    safe_text,
)
safe_trees = st.recursive(
    safe_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(safe_keys, children, max_size=4)
    ),
    max_leaves=30,
)
_B64URL = string.ascii_letters + string.digits + "-_"


def _luhn_complete(prefix: str) -> str:
    for check in "0123456789":
        candidate = prefix + check
        total = 0
        for i, ch in enumerate(reversed(candidate)):
            n = int(ch)
            if i % 2 == 1:
                n = n * 2 - 9 if n > 4 else n * 2
            total += n
        if total % 10 == 0:
            return candidate
    raise AssertionError("unreachable")


jwts = st.builds(
    lambda h, p, s: f"eyJ{h}.{p}.{s}",
    st.text(alphabet=_B64URL, min_size=4, max_size=40),
    st.text(alphabet=_B64URL, min_size=4, max_size=80),
    st.text(alphabet=_B64URL, min_size=0, max_size=60),
)
cards = st.builds(_luhn_complete, st.text(alphabet=string.digits, min_size=12, max_size=18)).filter(
    lambda c: c[0] != "0"
)
ssns = st.from_regex(r"\A[1-8]\d{2}-\d{2}-\d{4}\Z")
ipv4s = st.ip_addresses(v=4).map(str)
phones = st.one_of(
    st.from_regex(r"\A\+[1-9]\d{0,2} \d{3} \d{3} \d{4}\Z"),
    st.from_regex(r"\A\(\d{3}\) \d{3}-\d{4}\Z"),
    st.from_regex(r"\A\d{3}-\d{3}-\d{4}\Z"),
)
aws_keys = st.from_regex(r"\AAKIA[A-Z0-9]{16}\Z")
hex_secrets = st.text(alphabet="0123456789abcdef", min_size=32, max_size=64)
bearer = (
    st.text(alphabet=_B64URL + ".", min_size=8, max_size=40)
    .filter(lambda t: any(c.isdigit() or c in "._-" for c in t))
    .map(lambda t: f"Bearer {t}")
)
pem = st.text(alphabet=string.ascii_letters + string.digits + "+/\n", min_size=8, max_size=80).map(
    lambda body: f"-----BEGIN PRIVATE KEY-----\n{body}\n-----END PRIVATE KEY-----"
)
planted_secrets = st.one_of(
    st.emails(), jwts, cards, ssns, ipv4s, phones, aws_keys, hex_secrets, bearer, pem
)


def _plant(data: st.DataObject, secret: str) -> dict[str, Any]:
    """A random tree of harmless values with ``secret`` inside one string, somewhere."""
    leaf: Any = f"{data.draw(safe_text)} {secret} {data.draw(safe_text)}"
    for _ in range(data.draw(st.integers(min_value=0, max_value=6))):
        if data.draw(st.booleans()):
            siblings = data.draw(st.lists(safe_trees, max_size=3))
            siblings.insert(data.draw(st.integers(0, len(siblings))), leaf)
            leaf = siblings
        else:
            node = data.draw(st.dictionaries(safe_keys, safe_trees, max_size=3))
            node[data.draw(safe_keys)] = leaf
            leaf = node
    top = data.draw(st.dictionaries(safe_keys, safe_trees, max_size=3))
    top[data.draw(safe_keys)] = leaf
    return top


# --- properties ----------------------------------------------------------------------


@given(data=st.data(), secret=planted_secrets)
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_planted_secret_never_survives(data: st.DataObject, secret: str) -> None:
    params = _plant(data, secret)
    out = json.dumps(mask_parameters(params))
    assert secret not in out
    assert json.dumps(secret)[1:-1] not in out  # nor in its JSON-escaped form


@given(data=st.data(), secret=planted_secrets)
def test_planted_secret_in_a_key_never_survives(data: st.DataObject, secret: str) -> None:
    params = {f"{data.draw(safe_text)} {secret}": data.draw(safe_trees)}
    out = json.dumps(mask_parameters(params))
    assert secret not in out


@given(tree=st.dictionaries(safe_keys, safe_trees, max_size=6))
def test_harmless_values_survive_unchanged(tree: dict[str, Any]) -> None:
    assert mask_parameters(tree) == tree


@given(
    data=st.data(),
    key=st.sampled_from(
        [
            "password",
            "API_KEY",
            "x-api-key",
            "apiKey",
            "Authorization",
            "client_secret",
            "accessToken",
            "refresh_token",
            "cardNumber",
            "cvv",
            "pin",
            "ssn",
            "Cookie",
            "private_key",
            "db_passwd",
            "aws_access_key",
            "session_key",
            "credentials",
        ]
    ),
    value=st.one_of(safe_trees, planted_secrets, st.text(min_size=1)),
)
def test_values_under_secret_keys_are_redacted(data: st.DataObject, key: str, value: Any) -> None:
    params = _plant(data, "marker")
    params["outer"] = {key: value}
    out = mask_parameters(params)
    assert out["outer"] == {key: REDACTED}


@given(
    tree=st.recursive(
        st.one_of(st.text(), st.integers(), st.none()),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
        max_leaves=60,
    )
)
def test_output_is_always_json(tree: Any) -> None:
    json.dumps(mask_value(tree))


# --- examples ------------------------------------------------------------------------


def test_capability_token_is_dropped_not_redacted() -> None:
    out = mask_parameters({"capability_token": "eyJx.y.z", "q": "ok"})
    assert out == {"q": "ok"}


def test_real_jwt_is_masked() -> None:
    token = jwt.encode({"sub": "did:agent:x", "tenant_id": "t1"}, "k" * 32, algorithm="HS256")
    assert token not in mask_text(f"use {token} please")


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("bob@example.com", "[REDACTED:email]"),
        ("Bearer abc.def-123", "Bearer [REDACTED:credential]"),
        ("Basic dXNlcjpwYXNz", "Basic [REDACTED:credential]"),
        ("AKIAIOSFODNN7EXAMPLE", "[REDACTED:aws_key]"),
        ("4111 1111 1111 1111", "[REDACTED:card]"),
        ("123-45-6789", "[REDACTED:ssn]"),
        ("+44 20 7946 0958", "[REDACTED:phone]"),
        ("(415) 555-2671", "[REDACTED:phone]"),
        ("192.168.0.10", "[REDACTED:ip]"),
        ("0123456789abcdef0123456789abcdef", "[REDACTED:secret]"),
        ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "[REDACTED:secret]"),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----",
            "[REDACTED:private_key]",
        ),
    ],
)
def test_patterns(text: str, masked: str) -> None:
    assert mask_text(f"x {text} y") == f"x {masked} y"


@pytest.mark.parametrize(
    "text",
    [
        "basic usage of the tool",
        "4111111111111112",  # fails the Luhn check
        "2024-01-15T10:00:00Z",
        "123e4567-e89b-12d3-a456-426614174000",
        "/usr/local/lib/python3.11/site-packages",
        "version 1.2.3",
        "core__get_current_time",
    ],
)
def test_harmless_text_is_kept(text: str) -> None:
    assert mask_text(text) == text


def test_integer_card_number_is_masked() -> None:
    assert mask_parameters({"n": 4111111111111111}) == {"n": "[REDACTED:card]"}


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("password", True),
        ("X-Auth-Token", True),
        ("author", False),
        ("shipping", False),
        ("max_tokens", False),
        ("spinner", False),
        ("apikey", True),
        ("authorization", True),
    ],
)
def test_secret_keys(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_colliding_masked_keys_keep_both_values() -> None:
    out = mask_parameters({"a@x.io": 1, "b@y.io": 2})
    assert sorted(out.values()) == [1, 2]


def test_caps() -> None:
    deep: Any = "leaf"
    for _ in range(MAX_DEPTH + 5):
        deep = {"k": deep}
    assert TRUNCATED in json.dumps(mask_parameters(deep))
    wide = mask_parameters({"items": list(range(MAX_ITEMS + 10))})
    assert wide["items"][-1] == TRUNCATED
    assert len(wide["items"]) == MAX_ITEMS + 1
    long = mask_parameters({"s": "g" * (MAX_STRING + 10)})
    assert long["s"].endswith(TRUNCATED)
    assert len(long["s"]) == MAX_STRING + len(TRUNCATED)


def test_secret_at_the_cut_of_a_long_string_is_masked_first() -> None:
    secret = "AKIAIOSFODNN7EXAMPLE"
    text = "g" * (MAX_STRING - 10) + " " + secret
    out = mask_parameters({"s": text})["s"]
    assert "AKIAIOSF" not in out


def test_keys_sanitize_the_same_the_second_time() -> None:
    # Key verdicts are remembered: a repeat must mask, redact and drop exactly as before.
    parameters = {
        "api_key": "abc",
        "user@example.com": "x",
        "capability_token": "t",
        "city": "Paris",
        "k" * 80: "long keys are not remembered",
    }
    first = mask_parameters(parameters)
    assert mask_parameters(parameters) == first
    assert first["api_key"] == "[REDACTED]"
    assert "capability_token" not in first
    assert "user@example.com" not in first
    assert first["city"] == "Paris"


def test_remembered_key_verdicts_stay_bounded() -> None:
    from toolfleet.events import masking

    for i in range(masking._KEY_VERDICTS_MAX + 100):
        mask_parameters({f"field_{i}": 1, "password": "p", "x" * 100 + str(i): 2})
    assert len(masking._KEY_VERDICTS) <= masking._KEY_VERDICTS_MAX
    assert not any(len(key) > 64 for key in masking._KEY_VERDICTS)
    assert mask_parameters({"password": "p"}) == {"password": "[REDACTED]"}
