"""How a durable checkpoint's state is stored: full or delta, plain or compressed.

Pure functions, no I/O. A state is a JSON object; its canonical form is compact JSON
with sorted keys. :func:`encode` stores a large state as a delta against its parent
checkpoint's state: an RFC 6902 JSON Patch (``add``, ``remove``, ``replace``), which,
unlike an RFC 7386 merge patch, carries ``null`` values faithfully. Either form is
zlib-compressed when it is large enough to gain from it. The ``encoding`` names what was
done (``json``, ``json+zlib``, ``delta``, ``delta+zlib``) and :func:`decode` undoes it:
``decode(encode(state, parent).payload, encoding, parent) == state``.
"""

from __future__ import annotations

import copy
import json
import zlib
from dataclasses import dataclass
from typing import Any

JsonPatch = list[dict[str, Any]]

ENCODINGS = frozenset({"json", "json+zlib", "delta", "delta+zlib"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Encoded:
    """A state as stored: the bytes and how to read them back."""

    payload: bytes
    encoding: str
    """``json`` or ``delta`` (against the parent's state), ``+zlib`` when compressed."""


def canonical_json(value: Any) -> bytes:
    """Compact, key-sorted UTF-8 JSON: equal values give equal bytes."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def encode(
    state: dict[str, Any],
    parent: dict[str, Any] | None,
    *,
    delta_min_bytes: int,
    compress_min_bytes: int,
) -> Encoded:
    """Encode ``state``; as a delta against ``parent`` when it is over ``delta_min_bytes``.

    ``parent`` None stores a full snapshot. A delta is kept only when it is smaller than
    the full state; the result is compressed when over ``compress_min_bytes``.
    """
    payload, encoding = canonical_json(state), "json"
    if parent is not None and len(payload) > delta_min_bytes:
        delta = canonical_json(diff(parent, state))
        if len(delta) < len(payload):
            payload, encoding = delta, "delta"
    if len(payload) > compress_min_bytes:
        packed = zlib.compress(payload, 6)
        if len(packed) < len(payload):
            payload, encoding = packed, f"{encoding}+zlib"
    return Encoded(payload=payload, encoding=encoding)


def decode(payload: bytes, encoding: str, parent: dict[str, Any] | None) -> dict[str, Any]:
    """The state :func:`encode` stored; ``parent`` is needed for a ``delta``.

    Raises:
        ValueError: unknown encoding, a delta without its parent, or corrupt bytes.
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"unknown checkpoint encoding {encoding!r}")
    raw = zlib.decompress(payload) if encoding.endswith("+zlib") else payload
    value = json.loads(raw)
    if encoding.startswith("delta"):
        if parent is None:
            raise ValueError("a delta checkpoint needs its parent's state")
        value = apply_patch(parent, value)
    if not isinstance(value, dict):
        raise ValueError("a checkpoint state is a JSON object")
    return value


def diff(old: Any, new: Any) -> JsonPatch:
    """The RFC 6902 patch that turns ``old`` into ``new`` (both JSON values)."""
    ops: JsonPatch = []
    _diff(old, new, "", ops)
    return ops


def _diff(old: Any, new: Any, path: str, ops: JsonPatch) -> None:
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old.keys() - new.keys():
            ops.append({"op": "remove", "path": f"{path}/{_escape(key)}"})
        for key, value in new.items():
            child = f"{path}/{_escape(key)}"
            if key not in old:
                ops.append({"op": "add", "path": child, "value": value})
            else:
                _diff(old[key], value, child, ops)
        return
    if isinstance(old, list) and isinstance(new, list):
        common = min(len(old), len(new))
        for i in range(common):
            _diff(old[i], new[i], f"{path}/{i}", ops)
        for i in range(common, len(new)):
            ops.append({"op": "add", "path": f"{path}/{i}", "value": new[i]})
        # From the end, so every index names the element it means when it is applied.
        for i in range(len(old) - 1, common - 1, -1):
            ops.append({"op": "remove", "path": f"{path}/{i}"})
        return
    if not _same(old, new):
        ops.append({"op": "replace", "path": path, "value": new})


def _same(a: Any, b: Any) -> bool:
    """JSON equality: ``1``, ``1.0`` and ``true`` differ (Python's ``==`` says equal)."""
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return canonical_json(a) == canonical_json(b)
    return type(a) is type(b) and json.dumps(a) == json.dumps(b)


def apply_patch(document: Any, patch: JsonPatch) -> Any:
    """Apply the ``add``/``remove``/``replace`` operations of an RFC 6902 patch.

    ``document`` is not modified. Raises ValueError when the patch does not fit it.
    """
    doc = copy.deepcopy(document)
    for op in patch:
        kind, tokens, value = op.get("op"), _tokens(op.get("path")), op.get("value")
        if not tokens:
            if kind not in ("add", "replace"):
                raise ValueError(f"cannot {kind} the whole document")
            doc = copy.deepcopy(value)
            continue
        target = doc
        for token in tokens[:-1]:
            target = _child(target, token)
        last = tokens[-1]
        if isinstance(target, dict):
            if kind in ("remove", "replace") and last not in target:
                raise ValueError(f"no member {last!r} to {kind}")
            if kind == "remove":
                del target[last]
            elif kind in ("add", "replace"):
                target[last] = copy.deepcopy(value)
            else:
                raise ValueError(f"unsupported patch operation {kind!r}")
        elif isinstance(target, list):
            index = len(target) if last == "-" and kind == "add" else _index(last)
            limit = len(target) if kind == "add" else len(target) - 1
            if index > limit:
                raise ValueError(f"index {index} out of range")
            if kind == "add":
                target.insert(index, copy.deepcopy(value))
            elif kind == "remove":
                del target[index]
            elif kind == "replace":
                target[index] = copy.deepcopy(value)
            else:
                raise ValueError(f"unsupported patch operation {kind!r}")
        else:
            raise ValueError("patch path goes through a scalar")
    return doc


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _tokens(path: object) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise ValueError(f"bad JSON pointer {path!r}")
    if not path:
        return []
    return [t.replace("~1", "/").replace("~0", "~") for t in path[1:].split("/")]


def _index(part: str) -> int:
    if not part.isdigit() or (part != "0" and part.startswith("0")):
        raise ValueError(f"bad array index {part!r}")
    return int(part)


def _child(value: Any, token: str) -> Any:
    if isinstance(value, dict):
        if token not in value:
            raise ValueError(f"no member {token!r}")
        return value[token]
    if isinstance(value, list):
        index = _index(token)
        if index >= len(value):
            raise ValueError(f"index {index} out of range")
        return value[index]
    raise ValueError("patch path goes through a scalar")
