"""A tool's result rules: validation mode, sanitization by field path, size limits.

Declared with ``@tool(results=Results(validation=..., sanitize=..., max_bytes=...))`` and
stored in the manifest, so every validator applies the same rules to a version.

Field paths are a small JSONPath subset: ``$.body``, ``$.items[*].title``,
``$.meta.*``, ``$.rows[0]``. A rule covers the field it names and everything below it;
where several rules cover a string, the most specific wins (more segments, then fewer
wildcards); ``*`` covers every string no other rule names.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_PATH = "*"
"""The rule for every string field no other rule covers."""


class ResultMode(StrEnum):
    STRICT = "strict"
    """The result must match the output schema as is."""
    COERCE = "coerce"
    """Listed safe coercions first (numeric strings, ``"true"``/``"false"``, a single value
    for a list, ISO dates checked), each one reported in the outcome's ``warnings``."""


class SanitizeAction(StrEnum):
    ALLOW = "allow"
    """Leave the field as it is (exempts a path from a ``*`` rule)."""
    ESCAPE = "escape"
    """Make the text inert: HTML entities, doubled SQL quotes, backslash-escaped shell
    metacharacters, defanged model delimiters; invisible characters and phrases with no
    escaped form (``ignore previous instructions``) are removed."""
    REDACT = "redact"
    """Replace every finding with ``[REDACTED]``; invisible characters are removed."""
    REJECT = "reject"
    """Fail the call with ``result_sanitization_rejected``."""


class Check(StrEnum):
    HTML = "html"
    """Script tags, event-handler attributes, ``javascript:`` URLs, active elements."""
    SQL = "sql"
    """Quote-breaking tautologies, stacked statements, ``UNION SELECT``, comment tails."""
    SHELL = "shell"
    """Command substitution, chained or piped commands, writes to system paths."""
    PROMPT_INJECTION = "prompt_injection"
    """Text aimed at the calling model: ignore-previous-instructions phrases, fake
    chat-template or tool delimiters, ``SYSTEM:`` headers."""
    INVISIBLE = "invisible"
    """Unicode tag characters (U+E0000-E007F), zero-width characters, bidi overrides."""


ALL_CHECKS: tuple[Check, ...] = tuple(Check)


class SanitizeRule(BaseModel):
    """What to do with the string fields under one path."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    action: SanitizeAction
    checks: tuple[Check, ...] = ALL_CHECKS
    """The detectors that run (default: all of them)."""


_SEGMENT = re.compile(r"\.(?P<name>[A-Za-z0-9_-]+|\*)|\[(?P<index>\d+|\*)\]")

#: A parsed path: field names, list indices, or ``*`` (any field) / ``[*]`` (any index).
PathPattern = tuple[str | int, ...]
ANY_KEY = "*"
ANY_INDEX = -1


_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")


def key_segment(key: str) -> str:
    """How a key shows in a reported path: ``.name``, or ``.*`` for a key that does not
    look like a field name (``<script>``, an e-mail address). Keys are data too, and a
    path must never carry a value into a warning, an error or an audit record."""
    return f".{key}" if _FIELD_NAME.fullmatch(key) else ".*"


def parse_path(path: str) -> PathPattern:
    """``"$.items[*].title"`` as ``("items", ANY_INDEX, "title")``.

    Raises:
        ValueError: ``path`` is not in the supported JSONPath subset.
    """
    text = path if path.startswith("$") else f"$.{path}"
    pos, parts = 1, []
    while pos < len(text):
        match = _SEGMENT.match(text, pos)
        if match is None:
            raise ValueError(f"{path!r} is not a field path like '$.items[*].title'")
        name, index = match.group("name"), match.group("index")
        if name is not None:
            parts.append(name)
        else:
            parts.append(ANY_INDEX if index == "*" else int(index))
        pos = match.end()
    return tuple(parts)


class ResultRules(BaseModel):
    """Everything the validator checks in one tool's results, besides the schema."""

    # "ignore", as the manifest holding it: a validator older than the executor that
    # registered a version must still read its manifest during a rolling upgrade.
    model_config = ConfigDict(frozen=True, extra="ignore", use_attribute_docstrings=True)

    mode: ResultMode = ResultMode.STRICT
    sanitize: dict[str, SanitizeRule] = Field(default_factory=dict)
    """Field path (or ``*``) to rule; empty: strings are not sanitized."""
    max_bytes: int | None = Field(default=None, ge=1)
    """Largest result (compact JSON) the tool may return; unset: the fleet's
    ``TOOLFLEET_MAX_RESULT_BLOB_BYTES`` applies at the executor."""
    max_depth: int = Field(default=64, ge=1, le=256)
    """Deepest nesting of objects and lists a result may have."""

    @field_validator("sanitize", mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        """``{"$.body": "escape"}`` means every check with that action."""
        if isinstance(value, dict):
            return {k: {"action": v} if isinstance(v, str) else v for k, v in value.items()}
        return value

    @field_validator("sanitize")
    @classmethod
    def _paths(cls, value: dict[str, SanitizeRule]) -> dict[str, SanitizeRule]:
        for path in value:
            if path != DEFAULT_PATH:
                parse_path(path)
        return value
