"""JSON text to Python values, fast and exact.

``orjson`` parses JSON several times faster than the standard library, but reads an
integer outside 64 bits as a ``float`` without a word (``18446744073709551617`` comes
back as ``1.8446744073709552e+19``), and JSON allows any integer. Such an integer has at
least 19 digits, so text holding a run of 19 digits goes to the standard library,
which keeps every integer exact; so does anything else orjson refuses.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import orjson

#: Where an integer past 64 bits may be (or a long fraction, or digits in a string:
#: those take the slow path needlessly but come out the same).
_LONG_DIGITS: Final = re.compile(rb"[0-9]{19}")
_LONG_DIGITS_TEXT: Final = re.compile(r"[0-9]{19}")


def loads(text: bytes | str) -> Any:
    """The value ``text`` holds; raises ``ValueError`` (``JSONDecodeError``) if not JSON."""
    long_digits = _LONG_DIGITS if isinstance(text, bytes) else _LONG_DIGITS_TEXT
    if long_digits.search(text) is not None:  # type: ignore[arg-type]
        return json.loads(text)
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:  # e.g. a lone surrogate escape orjson refuses
        return json.loads(text)
