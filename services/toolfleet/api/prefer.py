"""The ``Prefer`` request header (RFC 7240), as far as ``POST /v1/invocations`` reads it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

MAX_WAIT_S: Final = 60
"""The longest ``Prefer: wait=N`` honoured; a larger N waits this long."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Preferences:
    """What the client prefers; ``None``/``False`` where it said nothing."""

    wait_s: int | None = None
    """``wait=N``, capped at :data:`MAX_WAIT_S`."""
    respond_async: bool = False
    """``respond-async``: answer ``202`` without waiting (unless ``wait`` says otherwise)."""


def parse_prefer(headers: Iterable[str]) -> Preferences:
    """Preferences of every ``Prefer`` header value; the first of each name counts.

    Preferences this API does not understand, and malformed values, are ignored, as
    RFC 7240 asks. Names are case-insensitive; values may be quoted; parameters after
    ``;`` are ignored.
    """
    wait: int | None = None
    respond_async = False
    seen: set[str] = set()
    for header in headers:
        for preference in header.split(","):
            token = preference.split(";", 1)[0].strip()
            name, _, value = token.partition("=")
            name = name.strip().lower()
            if not name or name in seen:
                continue
            seen.add(name)
            value = value.strip().strip('"')
            if name == "wait" and value.isascii() and value.isdigit():
                wait = min(int(value), MAX_WAIT_S)
            elif name == "respond-async":
                respond_async = True
    return Preferences(wait_s=wait, respond_async=respond_async)
