"""``coerce`` mode: the listed safe coercions of a result toward its output schema.

Only these, each reported as a warning naming the field path and the two types, never
the value:

* a numeric string where the schema wants a number or an integer (``"42"``, ``"-1.5"``;
  not ``"1e400"``, ``"NaN"``, ``"0x10"`` or ``" 4 "``);
* ``"true"`` / ``"false"`` where it wants a boolean;
* a single value where it wants a list (becomes a one-item list);
* a string with ``format: date`` / ``date-time`` must parse as an ISO 8601 date.

A value of the wrong type that none of these converts is a coercion failure; anything
else the schema refuses is left to schema validation. Local ``$ref`` (``#/$defs/...``),
``anyOf``/``oneOf`` (a value matching one branch is left alone) and ``allOf`` are
followed; the walk never recurses deeper than the result does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from toolfleet.contract.result_rules import key_segment
from toolfleet.errors import ResultCoercionFailed

_INTEGER = re.compile(r"[+-]?\d{1,30}")
_NUMBER = re.compile(r"[+-]?(?:\d{1,30}(?:\.\d{1,30})?|\.\d{1,30})(?:[eE][+-]?\d{1,3})?")
_JSON_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
#: A result walks at most this many ``$ref`` hops per value (cyclic schemas stop here).
_MAX_REF_HOPS = 32


@dataclass(slots=True)
class Coercion:
    """The result after coercion, and what changed or could not be changed."""

    value: Any
    applied: list[str] = field(default_factory=list)
    """One line per coercion: ``"$.count: string to integer"``."""
    impossible: list[dict[str, str]] = field(default_factory=list)
    """``{"field", "expected"}`` per value no listed coercion converts."""


def coerce(schema: dict[str, Any], value: Any) -> Coercion:
    """``value`` with the listed coercions toward ``schema`` applied.

    Raises:
        ResultCoercionFailed: a value has the wrong type and no listed coercion fits;
            ``details["errors"]`` names each field and the type it should have had.
    """
    walk = _Walk(root=schema)
    result = Coercion(value=walk.value(schema, value, "$"))
    result.applied = walk.applied
    result.impossible = walk.impossible
    if result.impossible:
        fields = ", ".join(e["field"] for e in result.impossible[:5])
        raise ResultCoercionFailed(
            f"the result has values no safe coercion turns into the declared type ({fields})",
            details={"errors": result.impossible[:50]},
        )
    return result


def json_type(value: Any) -> str:
    """The JSON Schema type name of a decoded JSON value (``integer`` for whole numbers)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _admits(types: list[str], actual: str) -> bool:
    return actual in types or (actual == "integer" and "number" in types)


@dataclass(slots=True)
class _Walk:
    root: dict[str, Any]
    applied: list[str] = field(default_factory=list)
    impossible: list[dict[str, str]] = field(default_factory=list)

    def resolve(self, schema: Any) -> dict[str, Any]:
        node = schema
        for _ in range(_MAX_REF_HOPS):
            if not isinstance(node, dict):
                return {}
            ref = node.get("$ref")
            if not isinstance(ref, str) or not ref.startswith("#"):
                return node
            target: Any = self.root
            for part in ref[1:].split("/")[1:]:
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part) if isinstance(target, dict) else None
            node = target
        return {}

    def value(self, schema: Any, value: Any, path: str) -> Any:
        node = self.resolve(schema)
        for keyword in ("allOf",):
            for sub in node.get(keyword) or []:
                value = self.value(sub, value, path)
        branches = node.get("anyOf") or node.get("oneOf")
        if isinstance(branches, list) and branches:
            return self.branches(branches, value, path)
        types = _types(node)
        actual = json_type(value)
        if types and not _admits(types, actual):
            converted = self.convert(types, node, value, path)
            if converted is _NOTHING:
                self.impossible.append({"field": path, "expected": " or ".join(types)})
                return value
            value = converted
        return self.inside(node, value, path)

    def branches(self, branches: list[Any], value: Any, path: str) -> Any:
        actual = json_type(value)
        resolved = [self.resolve(b) for b in branches]
        for branch in resolved:  # a value some branch admits as is stays as it is
            types = _types(branch)
            if not types or _admits(types, actual):
                return self.inside(branch, value, path)
        for branch in resolved:
            converted = self.convert(_types(branch), branch, value, path)
            if converted is not _NOTHING:
                return self.inside(branch, converted, path)
        expected = sorted({t for b in resolved for t in _types(b)})
        self.impossible.append({"field": path, "expected": " or ".join(expected)})
        return value

    def convert(self, types: list[str], node: dict[str, Any], value: Any, path: str) -> Any:
        actual = json_type(value)
        for wanted in types:
            converted = _convert(wanted, value)
            if converted is not _NOTHING:
                self.applied.append(f"{path}: {actual} to {wanted}")
                if wanted == "array":
                    items = self.resolve(node.get("items", {}))
                    return [self.value(items, converted[0], f"{path}[0]")]
                return converted
        return _NOTHING

    def inside(self, node: dict[str, Any], value: Any, path: str) -> Any:
        if isinstance(value, dict):
            props = node.get("properties") or {}
            extra = node.get("additionalProperties")
            out = {}
            for key, item in value.items():
                sub = props.get(key, extra if isinstance(extra, dict) else None)
                child = path + key_segment(key)
                out[key] = self.value(sub, item, child) if sub is not None else item
            return out
        if isinstance(value, list):
            items = node.get("items")
            if not isinstance(items, dict):
                return value
            return [self.value(items, item, f"{path}[{i}]") for i, item in enumerate(value)]
        fmt = node.get("format")
        if isinstance(value, str) and fmt in ("date", "date-time") and not _is_iso(fmt, value):
            self.impossible.append({"field": path, "expected": f"ISO 8601 {fmt}"})
        return value


class _Nothing:
    """No coercion applies (``None`` is a value: JSON null)."""


_NOTHING: Any = _Nothing()


def _types(node: dict[str, Any]) -> list[str]:
    declared = node.get("type")
    if isinstance(declared, str):
        return [declared] if declared in _JSON_TYPES else []
    if isinstance(declared, list):
        return [t for t in declared if t in _JSON_TYPES]
    if "const" in node:
        return [json_type(node["const"])]
    return []


def _convert(wanted: str, value: Any) -> Any:
    if isinstance(value, str):
        if wanted == "integer" and _INTEGER.fullmatch(value):
            return int(value)
        if wanted == "number" and _NUMBER.fullmatch(value):
            number = float(value)
            if math.isfinite(number):
                return int(number) if _INTEGER.fullmatch(value) else number
        if wanted == "boolean" and value in ("true", "false"):
            return value == "true"
    if wanted == "array" and not isinstance(value, list) and value is not None:
        return [value]
    return _NOTHING


def _is_iso(fmt: str, text: str) -> bool:
    try:
        if fmt == "date":
            date.fromisoformat(text)
        else:
            datetime.fromisoformat(text)
    except ValueError:
        return False
    return True
