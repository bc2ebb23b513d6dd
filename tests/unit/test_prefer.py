"""``Prefer`` (RFC 7240): wait and respond-async, everything else ignored."""

from __future__ import annotations

import pytest

from toolfleet.api.prefer import MAX_WAIT_S, Preferences, parse_prefer

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([], Preferences()),
        (["wait=10"], Preferences(wait_s=10)),
        (['WAIT = "5"'], Preferences(wait_s=5)),
        (["respond-async, wait=3"], Preferences(wait_s=3, respond_async=True)),
        (["handling=lenient", "wait=7;foo=bar"], Preferences(wait_s=7)),
        (["wait=600"], Preferences(wait_s=MAX_WAIT_S)),
        (["wait=1", "wait=9"], Preferences(wait_s=1)),  # the first one counts
        (["wait=-1", "wait=abc"], Preferences()),
        (["wait=\u0663"], Preferences()),  # an Arabic-Indic digit is not delta-seconds
        (["respond-async"], Preferences(respond_async=True)),
        ([",,;=, =3"], Preferences()),
    ],
)
def test_parse_prefer(headers: list[str], expected: Preferences) -> None:
    assert parse_prefer(headers) == expected
