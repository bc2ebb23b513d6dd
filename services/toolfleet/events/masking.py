"""Masks secrets and PII in tool parameters before they reach an audit event or a status row.

Two rules, applied recursively through nested mappings and sequences:

* a value under a secret-ish key (``password``, ``api_key``, ``Authorization``,
  ``x-auth-token``, ``cardNumber`` ...) is replaced whole by ``"[REDACTED]"``, whatever
  its type; a ``capability_token`` key is dropped altogether;
* in every other string (keys included), substrings that look like secrets or PII are
  masked in place as ``"[REDACTED:<kind>]"``: PEM private keys, JWTs, ``Bearer``/
  ``Basic`` credentials, AWS access key ids, e-mail addresses, long hex or base64
  secrets (32+ characters), Luhn-valid card numbers, US SSNs, phone numbers and IPv4
  addresses. Integers are checked as their decimal text (a card number sent as a number).

Output is bounded: nesting deeper than :data:`MAX_DEPTH`, more than :data:`MAX_ITEMS`
members in one container, more than :data:`MAX_NODES` values in total or strings longer
than :data:`MAX_STRING` (after masking, so no secret is ever cut in half and leaked)
are cut and marked ``"[TRUNCATED]"``. The functions are pure and never raise on
JSON-like input; anything not JSON-like is rendered as its type name.

Masking errs towards over-redaction: an audit log that hides a harmless value is a
nuisance, one that keeps a secret is an incident. Audit and status both sanitize, so the
module lives here, below both.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

REDACTED: Final = "[REDACTED]"
TRUNCATED: Final = "[TRUNCATED]"
MAX_DEPTH: Final = 16
MAX_ITEMS: Final = 256
MAX_NODES: Final = 5_000
MAX_STRING: Final = 4_096

#: Key words whose value is a secret whatever it looks like (matched per word of a key).
_SECRET_WORDS: Final = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "passphrase",
        "secret",
        "token",
        "apikey",
        "authorization",
        "auth",
        "credential",
        "credentials",
        "cookie",
        "ssn",
        "cvv",
        "pin",
    }
)
#: Two-word key phrases that mark a secret (``api_key``, ``privateKey``, ``Card-Number``).
_SECRET_PHRASES: Final = frozenset(
    {
        ("api", "key"),
        ("private", "key"),
        ("access", "key"),
        ("session", "key"),
        ("secret", "key"),
        ("card", "number"),
    }
)
#: Run-together spellings: "apikey", "privatekey", "cardnumber", "accesstoken".
_SECRET_RUN_TOGETHER: Final = frozenset(
    {"".join(phrase) for phrase in _SECRET_PHRASES}
    | {"accesstoken", "refreshtoken", "idtoken", "clientsecret"}
)
#: Keys never copied at all, not even as ``[REDACTED]``.
_DROPPED_KEYS: Final = frozenset({"capability_token", "capabilitytoken"})

_WORD_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")


def _mask(kind: str) -> str:
    return f"[REDACTED:{kind}]"


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        n = ord(ch) - 48
        if i % 2 == 1:
            n = n * 2 - 9 if n > 4 else n * 2
        total += n
    return total % 10 == 0


def _card(match: re.Match[str]) -> str:
    digits = re.sub(r"\D", "", match.group(0))
    return _mask("card") if 13 <= len(digits) <= 19 and _luhn_ok(digits) else match.group(0)


def _high_entropy(match: re.Match[str]) -> str:
    text = match.group(0)
    # Mixed case and digits: a random token, not a word, a path or a snake_case name.
    if re.search(r"[a-z]", text) and re.search(r"[A-Z]", text) and re.search(r"\d", text):
        return _mask("secret")
    return text


def _bearer(match: re.Match[str]) -> str:
    # "bearer bonds" is prose; a credential has a digit or a symbol in it.
    token = match.group(0).split(None, 1)[1]
    if re.search(r"[\d._~+/=-]", token):
        return match.group(0)[: -len(token)] + _mask("credential")
    return match.group(0)


def _basic(match: re.Match[str]) -> str:
    # "Basic usage" is prose; a Basic credential is base64 of "user:password".
    token = match.group(0).split(None, 1)[1]
    try:
        decoded = base64.b64decode(token + "=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return match.group(0)
    if b":" in decoded:
        return match.group(0)[: -len(token)] + _mask("credential")
    return match.group(0)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Rule:
    """One pattern and its mask, with cheap necessary conditions for it to match at all.

    Most text (a timestamp, a tool id, a sentence) holds no ``@``, no ``eyJ``, no
    ``-----BEGIN`` and is shorter than a hex secret, so most rules are skipped by a
    substring or length test instead of a regex scan. Each condition must hold for every
    possible match: ``tests/unit/test_masking_guards.py`` holds them to the unguarded
    rules.
    """

    kind: str
    pattern: re.Pattern[str]
    replace: Callable[[re.Match[str]], str] | None = None
    min_length: int
    """Length of the shortest text the pattern can match."""
    literal: str | None = None
    """A substring of every match."""
    folded: str | None = None
    """A substring of every match, ignoring case (tested on ASCII text only)."""
    digits: int = 0
    """Decimal digits (``\\d``) every match holds at least (counted in ASCII text; in other
    text, any digit at all passes)."""
    replacement: str | Callable[[re.Match[str]], str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "replacement", self.replace or _mask(self.kind))

    def apply(self, text: str) -> str:
        """``text`` with every match of this rule masked (no guard)."""
        return self.pattern.sub(self.replacement, text)


_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"

#: Order matters: whole structures (PEM, JWT) before the fragments they contain.
_RULES: Final[tuple[_Rule, ...]] = (
    _Rule(
        kind="private_key",
        pattern=re.compile(
            r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END[A-Z0-9 ]*PRIVATE KEY-----|.*)",
            re.DOTALL,
        ),
        min_length=26,
        literal="-----BEGIN",
    ),
    _Rule(
        kind="jwt",
        pattern=re.compile(r"eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"),
        min_length=7,
        literal="eyJ",
    ),
    _Rule(
        kind="credential",
        pattern=re.compile(r"\bBearer\s+[A-Za-z0-9._~+/=-]{8,}", re.IGNORECASE),
        replace=_bearer,
        min_length=15,
        folded="bearer",
    ),
    _Rule(
        kind="credential",
        pattern=re.compile(r"\bBasic\s+[A-Za-z0-9+/]{4,}={0,2}", re.IGNORECASE),
        replace=_basic,
        min_length=10,
        folded="basic",
    ),
    _Rule(
        kind="aws_key",
        pattern=re.compile(r"(?:AKIA|ASIA|AGPA|AIDA|AROA)[A-Z0-9]{16}"),
        min_length=20,
        literal="A",
    ),
    _Rule(
        kind="email",
        # RFC 5322 dot-atom local part; punycode TLDs (xn--...) included.
        pattern=re.compile(
            r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z][A-Za-z0-9-]*[A-Za-z0-9]"
        ),
        min_length=6,
        literal="@",
    ),
    _Rule(
        kind="secret",
        pattern=re.compile(r"(?<![0-9A-Za-z])[0-9A-Fa-f]{32,}(?![0-9A-Za-z])"),
        min_length=32,
    ),
    _Rule(
        kind="secret",
        pattern=re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{32,}={0,2}"),
        replace=_high_entropy,
        min_length=32,
    ),
    _Rule(
        kind="card",
        pattern=re.compile(r"(?<!\d)\d(?:[ -]?\d){12,18}(?!\d)"),
        replace=_card,
        min_length=13,
        digits=13,
    ),
    _Rule(
        kind="ssn",
        pattern=re.compile(r"(?<!\d)\d{3}-\d{2}-\d{4}(?!\d)"),
        min_length=11,
        literal="-",
        digits=9,
    ),
    _Rule(
        kind="phone",
        pattern=re.compile(
            r"(?<![\w+])\+\d{1,3}[ .-]?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]?\d{2,4}){1,4}(?!\d)"
            r"|(?<![\w.])\(?\d{3}\)?[ .-]\d{3}[ .-]\d{4}(?!\d)"
        ),
        min_length=6,
        digits=5,
    ),
    _Rule(
        kind="ip",
        pattern=re.compile(rf"(?<!\d)(?<!\d\.){_OCTET}(?:\.{_OCTET}){{3}}(?!\.?\d)"),
        min_length=7,
        literal=".",
        digits=4,
    ),
)
_SHORTEST_MATCH: Final = min(rule.min_length for rule in _RULES)
_DIGIT: Final = re.compile(r"\d")
_DROP_ASCII_DIGITS: Final = str.maketrans("", "", "0123456789")
#: An RFC 3339 timestamp as pydantic and the codec write them (lifecycle events carry
#: several). No rule matches one: it has no letter run, no "@", at most eight digits
#: joined by single "-", one "." and no "+" that does not follow a digit.
_TIMESTAMP: Final = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
    r"(?:\.[0-9]{1,9})?(?:Z|[+-][0-9]{2}:[0-9]{2})?"
)
#: The rules as ``mask_text`` runs them: guards first, then ``sub`` and its replacement.
_GUARDED: Final = tuple(
    (rule.min_length, rule.literal, rule.folded, rule.digits, rule.pattern.sub, rule.replacement)
    for rule in _RULES
)


def mask_text(text: str) -> str:
    """``text`` with every secret- or PII-looking substring replaced by a mask."""
    if len(text) < _SHORTEST_MATCH or (text[4:5] == "-" and _TIMESTAMP.fullmatch(text)):
        return text
    # Taken from the text as it came: a mask replaces a match with "[REDACTED:<kind>]",
    # which holds no digit and cannot complete "bearer" or "basic" with its neighbours,
    # so a later rule can only lose, never gain, what these say the text holds.
    size = len(text)
    if text.isascii():
        folded: str | None = text.lower()
        digit_count = size - len(text.translate(_DROP_ASCII_DIGITS))
    else:  # ``\d`` matches digits of every script: any one lets every rule run
        folded = None
        digit_count = size if _DIGIT.search(text) is not None else 0
    for min_length, literal, folded_literal, digits, sub, replacement in _GUARDED:
        if (
            size < min_length
            or (literal is not None and literal not in text)
            or (folded_literal is not None and folded is not None and folded_literal not in folded)
            or digits > digit_count
        ):
            continue
        text = sub(replacement, text)
        size = len(text)
    return text


def key_words(key: str) -> list[str]:
    """The lower-case words of a key: ``"X-Api-Key"`` and ``"xApiKey"`` give api, key."""
    return [w.lower() for w in _WORD_SPLIT.split(key) if w]


def is_secret_key(key: str) -> bool:
    """Whether a value stored under ``key`` is a secret whatever it looks like."""
    words = key_words(key)
    if not _SECRET_WORDS.isdisjoint(words):
        return True
    if not _SECRET_PHRASES.isdisjoint(itertools.pairwise(words)):
        return True
    return "".join(words) in _SECRET_RUN_TOGETHER


class _Budget:
    """Counts values visited so one huge payload cannot blow up the audit record."""

    __slots__ = ("left",)

    def __init__(self, nodes: int) -> None:
        self.left = nodes

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


def _clip(text: str) -> str:
    return text if len(text) <= MAX_STRING else text[:MAX_STRING] + TRUNCATED


def _value(value: Any, depth: int, budget: _Budget) -> Any:
    if not budget.take():
        return TRUNCATED
    if value is None or isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        text = str(value)
        masked = mask_text(text)
        return value if masked == text else masked
    if isinstance(value, str):
        return _clip(mask_text(value))
    if isinstance(value, Mapping):
        return _mapping(value, depth + 1, budget) if depth < MAX_DEPTH else TRUNCATED
    if isinstance(value, Sequence | set | frozenset) and not isinstance(value, bytes | bytearray):
        if depth >= MAX_DEPTH:
            return TRUNCATED
        items = list(value)
        out = [_value(v, depth + 1, budget) for v in items[:MAX_ITEMS]]
        if len(items) > MAX_ITEMS:
            out.append(TRUNCATED)
        return out
    return f"<{type(value).__name__}>"


def _mapping(value: Mapping[Any, Any], depth: int, budget: _Budget) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for index, (raw_key, item) in enumerate(value.items()):
        if index >= MAX_ITEMS:
            out[TRUNCATED] = TRUNCATED
            break
        key = str(raw_key)
        verdict = _KEY_VERDICTS.get(key)
        if verdict is None:
            verdict = _key_verdict(key)
        masked, secret = verdict
        if masked is None:
            continue
        out[_unique(out, masked)] = REDACTED if secret else _value(item, depth, budget)
    return out


#: What :func:`_key_verdict` said of the short keys seen lately: a tool's parameters
#: repeat the same few keys, and masking and splitting each every time was a third of
#: building an audit record. Keys come from the wire, so it is bounded and cleared
#: when full; long keys are never kept.
_KEY_VERDICTS: dict[str, tuple[str | None, bool]] = {}
_KEY_VERDICTS_MAX: Final = 4_096
_CACHED_KEY_LENGTH: Final = 64


def _key_verdict(key: str) -> tuple[str | None, bool]:
    """``(masked key, whether its value is a secret)``; masked key ``None``: dropped."""
    if key.lower() in _DROPPED_KEYS:
        verdict: tuple[str | None, bool] = (None, True)
    else:
        verdict = (_clip(mask_text(key)), is_secret_key(key))
    if len(key) <= _CACHED_KEY_LENGTH:
        if len(_KEY_VERDICTS) >= _KEY_VERDICTS_MAX:
            _KEY_VERDICTS.clear()
        _KEY_VERDICTS[key] = verdict
    return verdict


def _unique(existing: Mapping[str, Any], key: str) -> str:
    # Two keys may mask to the same text ("a@x.io", "b@y.io"): keep both values.
    if key not in existing:
        return key
    n = 2
    while f"{key}#{n}" in existing:
        n += 1
    return f"{key}#{n}"


def mask_parameters(parameters: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``parameters`` that is safe to log, audit and store (see module doc)."""
    if not parameters:
        return {}
    return _mapping(parameters, 0, _Budget(MAX_NODES))


def mask_value(value: Any) -> Any:
    """Like :func:`mask_parameters` for any JSON-like value."""
    return _value(value, 0, _Budget(MAX_NODES))
