"""Lossless text for Postgres: the characters it refuses are stored escaped.

Postgres refuses NUL in ``text`` and in ``jsonb`` strings, and a lone UTF-16 surrogate
(which Python strings and JSON ``\\ud800`` escapes can hold) has no UTF-8 encoding at
all. Both reach toolfleet in tool parameters and results, and the status projection
must store them, not drop the invocation. So every such character is written as
:data:`ESCAPE` followed by its code point in four lower-case hex digits, and
:data:`ESCAPE` itself is escaped the same way, which makes the mapping reversible::

    "a\\x00b"   <->  "a\\ue0000000b"
    "\\ud800"    <->  "\\ue000d800"
    "\\ue000"    <->  "\\ue000e000"

:func:`install` puts the codec on a connection for ``text``, ``json`` and ``jsonb``
(every string and object key inside JSON), so SQL compares escaped with escaped and
reads come back as written. asyncpg cannot override the codec of an array type:
``text[]`` parameters go through :func:`escape_array` and ``text[]`` columns read back
through :func:`unescape_array`. Anything reading the tables with plain SQL sees the
escaped form; text without those characters is stored unchanged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, Final

import asyncpg
import orjson
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from toolfleet import json_text

ESCAPE: Final = "\ue000"
"""First character of an escape: the first code point of Unicode's private use area."""

# NUL, every surrogate, and the escape character itself.
_REFUSED: Final = re.compile("[\x00\ud800-\udfff\ue000]")
_ESCAPED: Final = re.compile("\ue000([0-9a-f]{4})")


def escape_text(text: str) -> str:
    """``text`` with NUL, surrogates and :data:`ESCAPE` escaped (unchanged if none)."""
    if text.isascii():  # of the three, only NUL is ASCII (the common case: two C scans)
        if "\x00" not in text:
            return text
    elif _REFUSED.search(text) is None:
        return text
    return _REFUSED.sub(lambda m: f"{ESCAPE}{ord(m.group()):04x}", text)


def unescape_text(text: str) -> str:
    """The inverse of :func:`escape_text`."""
    if ESCAPE not in text:
        return text
    return _ESCAPED.sub(lambda m: chr(int(m.group(1), 16)), text)


def escape_json(value: Any) -> Any:
    """``value`` with every string and object key escaped by :func:`escape_text`."""
    if isinstance(value, str):
        return escape_text(value)
    if isinstance(value, dict):
        return {
            escape_text(k) if isinstance(k, str) else k: escape_json(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [escape_json(v) for v in value]
    return value


def unescape_json(value: Any) -> Any:
    """The inverse of :func:`escape_json`."""
    if isinstance(value, str):
        return unescape_text(value)
    if isinstance(value, dict):
        return {unescape_text(k): unescape_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [unescape_json(v) for v in value]
    return value


def escape_array(values: Iterable[str | None]) -> list[str | None]:
    """A ``text[]`` parameter: each element escaped."""
    return [None if v is None else escape_text(v) for v in values]


def unescape_array(values: Iterable[str | None] | None) -> list[str | None] | None:
    """A ``text[]`` column as written: each element unescaped."""
    if values is None:
        return None
    return [None if v is None else unescape_text(v) for v in values]


def jsonable(model: BaseModel, *, include: set[str] | None = None) -> dict[str, Any]:
    """``model.model_dump(mode="json")`` with every text kept as sent.

    pydantic's JSON mode cannot encode a lone surrogate in an object key (nested in a
    free-form member it raises, at the top it writes replacement characters), and tool
    output may carry one. So the texts are escaped around the one serializer pass."""
    dumped = model.model_dump(include=include)
    try:
        # orjson refuses a lone surrogate anywhere (key or value): none, no escaping.
        orjson.dumps(dumped, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        escaped: dict[str, Any] = unescape_json(to_jsonable_python(escape_json(dumped)))
        return escaped
    plain: dict[str, Any] = to_jsonable_python(dumped)
    return plain


def encode_json(value: object) -> str:
    """JSON text Postgres accepts for ``json``/``jsonb``, whatever strings ``value`` holds."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:  # lone surrogates, or integers past 64 bits (JSON allows them)
        return json.dumps(escape_json(value), ensure_ascii=False)
    # orjson writes NUL as \u0000; the escape character is written as is.
    if "\\u0000" in text or ESCAPE in text:
        return orjson.dumps(escape_json(value)).decode()
    return text


def decode_json(text: str) -> Any:
    """The value :func:`encode_json` was given."""
    value = json_text.loads(text)
    # jsonb returns the escape character as is; ``json`` keeps the text it was given,
    # where it may be an ASCII escape.
    if ESCAPE in text or "\\ue000" in text or "\\uE000" in text:
        return unescape_json(value)
    return value


async def install(conn: asyncpg.Connection) -> None:
    """Put the lossless codecs on ``conn`` for ``text``, ``json`` and ``jsonb``."""
    await conn.set_type_codec(
        "text", encoder=escape_text, decoder=unescape_text, schema="pg_catalog", format="text"
    )
    for type_name in ("json", "jsonb"):
        await conn.set_type_codec(
            type_name, encoder=encode_json, decoder=decode_json, schema="pg_catalog"
        )
