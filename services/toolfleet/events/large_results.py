"""Results too large to travel inline: their size, their blob, their preview.

An event carries at most ``TOOLFLEET_RESULT_INLINE_BYTES`` of result. A larger result
leaves the executor as a *transfer* blob (``result_blob`` of ``invoke.executed``)
and reaches the client as a blob *attachment* beside a truncated preview, with
``execution_metadata.truncated`` set (contract section 3).

The preview keeps the result's shape: the same keys, the first items of long lists and
the start of long strings (ending in ``…``), cut until it fits the budget. It is
for reading, not for parsing: the attachment is the whole result.
"""

from __future__ import annotations

import json
from typing import Any

#: Marks a string the preview cut short.
ELLIPSIS = "…"
#: The shortest strings and lists a preview cuts down to before it gives up on a shape.
_MIN_CHARS = 16
_MIN_ITEMS = 1
#: A preview lists at most this many items of any list: enough to read, quick to cut.
_MAX_ITEMS = 1024
#: Objects keep at least this many keys (their first ones) while lists are cut.
_MIN_KEYS = 32
#: Deeper values are dropped from a preview (results this deep are rare and unreadable).
_MAX_DEPTH = 64


def encode_result(result: dict[str, Any]) -> bytes:
    """The result as compact UTF-8 JSON: how it is measured and stored."""
    return json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode()


def attachment_url(invocation_id: str, blob_id: str) -> str:
    """Where the status API serves an attachment (relative to the API's base URL)."""
    return f"/v1/invocations/{invocation_id}/attachments/{blob_id}"


def preview(result: dict[str, Any], budget_bytes: int) -> dict[str, Any]:
    """``result`` cut down until its encoding fits ``budget_bytes`` (``{}`` at worst).

    Strings are first held to half the budget; then lists and objects lose items
    (fewer whole items read better than many mangled ones); then strings are cut.
    """
    max_chars = max(budget_bytes // 2, _MIN_CHARS)
    max_items = max(min(budget_bytes // 4, _MAX_ITEMS), _MIN_ITEMS)
    shrunk: dict[str, Any] = result
    while True:
        shrunk = _shrink(shrunk, max_chars, max_items, 0)
        if len(encode_result(shrunk)) <= budget_bytes:
            return shrunk
        if max_items > _MIN_ITEMS:
            max_items = max(max_items // 2, _MIN_ITEMS)
        elif max_chars > _MIN_CHARS:
            max_chars = max(max_chars // 2, _MIN_CHARS)
        else:
            return {}


def _shrink(value: Any, max_chars: int, max_items: int, depth: int) -> Any:
    if isinstance(value, str):
        return value if len(value) <= max_chars else value[: max_chars - 1] + ELLIPSIS
    if isinstance(value, list):
        if depth >= _MAX_DEPTH:
            return []
        return [_shrink(v, max_chars, max_items, depth + 1) for v in value[:max_items]]
    if isinstance(value, dict):
        if depth >= _MAX_DEPTH:
            return {}
        kept = list(value.items())[: max(max_items, _MIN_KEYS)]
        return {k: _shrink(v, max_chars, max_items, depth + 1) for k, v in kept}
    return value
