"""JSON text to Python values, fast and exact.

``orjson`` parses JSON several times faster than the standard library, but reads an
integer outside 64 bits as a ``float`` without a word (``18446744073709551617`` comes
back as ``1.8446744073709552e+19``), and JSON allows any integer. Such an integer has at
least 19 digits, so text holding a run of 19 digits goes to the standard library,
which keeps every integer exact; so does anything else orjson refuses.
"""

from __future__ import annotations

import json
from typing import Any, Final

import orjson

#: Every byte to a space but ASCII digits, which become "0": a run of 19 digits is then
#: a plain substring search, where a regular expression costs several times orjson's
#: whole parse. Where an integer past 64 bits may be (or a long fraction, or digits in
#: a string: those take the slow path needlessly but come out the same).
_DIGITS_ONLY: Final = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_LONG_RUN: Final = b"0" * 19


def loads(text: bytes | str) -> Any:
    """The value ``text`` holds; raises ``ValueError`` (``JSONDecodeError``) if not JSON."""
    raw = text if isinstance(text, bytes) else text.encode(errors="surrogatepass")
    if _LONG_RUN in raw.translate(_DIGITS_ONLY):
        return json.loads(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # e.g. a lone surrogate escape orjson refuses
        return json.loads(text)
