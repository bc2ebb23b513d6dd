"""``Secret`` never shows its value by accident; names and path parts are validated."""

from __future__ import annotations

import copy
import io
import json
import logging
import pickle

import pytest

from toolfleet.observability.logs import JsonFormatter
from toolfleet.secrets.store import Secret, check_name, is_path_segment

pytestmark = pytest.mark.unit

VALUE = "s3cr3t-value-XYZ"


def test_repr_str_and_format_are_masked() -> None:
    secret = Secret(VALUE)
    rendered = [
        repr(secret),
        str(secret),
        f"{secret}",
        f"{secret!r}",
        f"{secret:>40}",
        "%s %r" % (secret, secret),  # noqa: UP031 - the old style must mask too
        "{}".format(secret),  # noqa: UP032
        repr([secret]),
        repr({"k": secret}),
    ]
    for text in rendered:
        assert VALUE not in text
        assert "Secret('***')" in text
    assert secret.reveal() == VALUE
    assert len(secret) == len(VALUE)


def test_logging_a_secret_shows_the_mask() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("test"))
    logger = logging.getLogger("toolfleet.test.secrets")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        secret = Secret(VALUE)
        logger.warning("using %s", secret, extra={"credential": secret})
    finally:
        logger.removeHandler(handler)
    line = stream.getvalue()
    assert VALUE not in line
    assert "Secret('***')" in line


def test_cannot_be_pickled_or_json_encoded() -> None:
    secret = Secret(VALUE)
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        with pytest.raises(TypeError, match="cannot be pickled"):
            pickle.dumps(secret, protocol=protocol)
    with pytest.raises(TypeError) as caught:
        json.dumps({"k": secret})
    assert VALUE not in str(caught.value)


def test_has_no_instance_dict_and_copies_stay_masked() -> None:
    secret = Secret(VALUE)
    assert not hasattr(secret, "__dict__")
    assert copy.copy(secret) is secret
    assert copy.deepcopy({"k": secret})["k"] is secret


def test_equality_is_by_value_and_secrets_are_unhashable() -> None:
    assert Secret(VALUE) == Secret(VALUE)
    assert Secret(VALUE) != Secret(VALUE + "!")
    assert Secret(VALUE) != VALUE
    with pytest.raises(TypeError):
        hash(Secret(VALUE))


def test_only_strings_are_wrapped() -> None:
    with pytest.raises(TypeError):
        Secret(b"bytes")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["api_key", "github", "token2", "a_b_c"])
def test_valid_credential_names(name: str) -> None:
    check_name(name)


@pytest.mark.parametrize(
    "name", ["", "API_KEY", "api-key", "_key", "key_", "a__b", "../x", "a/b", "k\x00", "x" * 65]
)
def test_invalid_credential_names(name: str) -> None:
    with pytest.raises(ValueError, match="not a credential name"):
        check_name(name)


@pytest.mark.parametrize("value", ["t1", "tenant_acme", "conn-1", "a.b", "urn:x:y"])
def test_path_segments(value: str) -> None:
    assert is_path_segment(value)


@pytest.mark.parametrize(
    "value",
    [
        "",
        ".",
        "..",
        "a/..",
        "../etc",
        "a/b",
        "a\\b",
        "/abs",
        ".hidden",
        "a..b",
        "a\x00b",
        "é",
        "x" * 257,
    ],
)
def test_path_segments_refused(value: str) -> None:
    assert not is_path_segment(value)
