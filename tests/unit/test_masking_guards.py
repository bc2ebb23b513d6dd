"""``mask_text``'s shortcuts change nothing: it equals every rule applied in turn.

``mask_text`` skips a rule when the text cannot hold a match of it (too short, no
``@``, no digit ...) and skips RFC 3339 timestamps altogether. These properties hold it
to the plain definition, every rule's substitution applied in order, on text built to
hit each rule, each shortcut's edge and the Unicode that ``\\d`` and ``re.IGNORECASE``
match beyond ASCII.
"""

from __future__ import annotations

import itertools
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.test_events_masking import planted_secrets
from toolfleet.events import masking
from toolfleet.events.masking import is_secret_key, mask_text

pytestmark = pytest.mark.unit


def every_rule(text: str) -> str:
    """The definition: each rule's substitution, in order, unguarded."""
    for rule in masking._RULES:
        text = rule.apply(text)
    return text


def is_secret_key_reference(key: str) -> bool:
    """``is_secret_key`` as first written (before its set lookups)."""
    words = masking.key_words(key)
    if any(w in masking._SECRET_WORDS for w in words):
        return True
    if any(pair in masking._SECRET_PHRASES for pair in itertools.pairwise(words)):
        return True
    joined = "".join(words)
    return any("".join(p) == joined for p in masking._SECRET_PHRASES) or joined in {
        "accesstoken",
        "refreshtoken",
        "idtoken",
        "clientsecret",
    }


#: Characters every rule looks for, plus non-ASCII ones ``\d`` or IGNORECASE match
#: (Arabic-Indic and fullwidth digits, long s, dotless i, the Kelvin sign).
_TRIGGERS = (
    string.ascii_letters
    + string.digits
    + " .-+()@:/=_~[]\n"
    + "\u0663\u0664\uff15\u017f\u0131\u212a\u0130"
)
_FRAGMENTS = [
    "Bearer ",
    "bearer ",
    "BASIC ",
    "ba\u017f\u0131c ",
    "BEARER ",
    "Basic dXNlcjpwYXNz",
    "eyJ",
    "AKIA",
    "ASIA",
    "-----BEGIN PRIVATE KEY-----",
    "-----END PRIVATE KEY-----",
    "@",
    "a@b.cd",
    "+1 23 45",
    "+44",
    "123-45-6789",
    "(415) 555-2671",
    "1.2.3.4",
    "2025-01-01T12:00:00Z",
    "4111 1111 1111 1111",
    "0123456789abcdef" * 2,
    "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY",
    "[REDACTED:ip]",
]
texts = st.one_of(
    st.text(),
    st.text(alphabet=_TRIGGERS, max_size=60),
    st.lists(
        st.one_of(st.sampled_from(_FRAGMENTS), st.text(alphabet=_TRIGGERS, max_size=8)),
        max_size=8,
    ).map("".join),
    st.tuples(st.text(alphabet=_TRIGGERS, max_size=12), planted_secrets).map(" ".join),
)
timestamps = st.builds(
    lambda moment, fraction, offset: moment.strftime("%Y-%m-%dT%H:%M:%S") + fraction + offset,
    st.datetimes(),
    st.sampled_from(["", ".5", ".123456", ".123456789"]),
    st.sampled_from(["", "Z", "+00:00", "+05:30", "-08:00"]),
)


@given(text=texts)
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_mask_text_is_every_rule_in_turn(text: str) -> None:
    assert mask_text(text) == every_rule(text)


@given(text=timestamps)
@settings(deadline=None)
def test_timestamps_are_left_as_they_are(text: str) -> None:
    assert mask_text(text) == every_rule(text) == text


@pytest.mark.parametrize("fragment", _FRAGMENTS)
def test_each_fragment_alone_and_in_text(fragment: str) -> None:
    for text in (fragment, f"x {fragment} y", f"{fragment}{fragment}", fragment.lower()):
        assert mask_text(text) == every_rule(text)


def test_the_shortest_matches_are_not_skipped() -> None:
    assert mask_text("a@b.cd") == "[REDACTED:email]"
    assert mask_text("+1 23 45") == "[REDACTED:phone]"
    assert mask_text("1.2.3.4") == "[REDACTED:ip]"
    assert mask_text("eyJa.b.") == "[REDACTED:jwt]"
    # The fewest digits each digit rule can match: 13 (a card), 9, 5, 4.
    assert mask_text("4222222222222") == "[REDACTED:card]"
    assert mask_text("123-45-6789") == "[REDACTED:ssn]"


@given(
    key=st.one_of(st.text(max_size=30), st.text(alphabet=string.ascii_letters + "_-", max_size=30))
)
@settings(max_examples=500, deadline=None)
def test_is_secret_key_is_unchanged(key: str) -> None:
    assert is_secret_key(key) is is_secret_key_reference(key)
