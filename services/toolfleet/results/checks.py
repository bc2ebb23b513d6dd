"""The result checks the validator runs, in order, for one tool version.

1. limits: the compact JSON size (the tool's ``max_bytes``) and the nesting depth;
2. ``coerce`` mode only: the listed safe coercions (:mod:`~toolfleet.results.coercion`);
3. the output schema, then the redaction allowlist
   (:func:`toolfleet.registry.enforcement.visible_result`);
4. sanitization of the string fields clients will see
   (:mod:`~toolfleet.results.sanitizer`).

Each step fails with its own error code; what steps 2 and 4 changed comes back as
warnings for the outcome.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from toolfleet.contract.manifest import ToolManifest
from toolfleet.contract.result_rules import ResultMode, ResultRules
from toolfleet.errors import ResultTooLarge
from toolfleet.registry.enforcement import visible_result
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.results.coercion import coerce
from toolfleet.results.sanitizer import CompiledSanitizer


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckedResult:
    result: dict[str, Any]
    """What clients may see: coerced, schema-checked, allowlisted and sanitized."""
    warnings: list[str] = field(default_factory=list)
    """Each coercion and each escape/redaction finding (field path and rule only)."""


class ResultChecker:
    """Runs a tool's result rules; each tool's sanitizer is compiled once and kept."""

    def __init__(self, schemas: CompiledSchemas, *, max_entries: int = 4096) -> None:
        self._schemas = schemas
        self._sanitizers: dict[str, CompiledSanitizer] = {}
        self._max_entries = max_entries

    def sanitizer(self, rules: ResultRules) -> CompiledSanitizer:
        key = json.dumps(rules.model_dump(mode="json")["sanitize"], sort_keys=True)
        found = self._sanitizers.get(key)
        if found is None:
            if len(self._sanitizers) >= self._max_entries:
                self._sanitizers.pop(next(iter(self._sanitizers)))
            found = self._sanitizers[key] = CompiledSanitizer(rules.sanitize)
        return found

    def check(self, manifest: ToolManifest, result: dict[str, Any]) -> CheckedResult:
        """``result`` as clients see it, or the typed error of the first check it fails.

        Raises:
            ResultTooLarge: over ``max_bytes`` or nested deeper than ``max_depth``.
            ResultCoercionFailed: ``coerce`` mode found a value it may not convert.
            ResultValidationFailed: the (coerced) result does not match the schema.
            ResultSanitizationRejected: a ``reject`` rule matched a visible string.
            RedactionFailed: the result could not be redacted to the allowlist.
        """
        rules = manifest.result_rules
        name = f"{manifest.tool_id}@{manifest.version}"
        check_limits(name, rules, result)
        warnings: list[str] = []
        if rules.mode is ResultMode.COERCE:
            coerced = coerce(manifest.output_schema, result)
            result = coerced.value
            warnings.extend(f"result coerced at {line}" for line in coerced.applied[:20])
            if len(coerced.applied) > 20:
                warnings.append(f"... and {len(coerced.applied) - 20} more coercions")
        visible = visible_result(self._schemas, manifest, result)
        sanitized = self.sanitizer(rules).apply(visible)
        warnings.extend(sanitized.warnings())
        return CheckedResult(result=sanitized.value, warnings=warnings)


def check_limits(name: str, rules: ResultRules, result: dict[str, Any]) -> None:
    """Refuse a result nested deeper than ``max_depth`` or larger than ``max_bytes``."""
    depth = nesting_depth(result, stop_after=rules.max_depth)
    if depth > rules.max_depth:
        raise ResultTooLarge(
            f"{name} returned a result nested too deeply (over {rules.max_depth} levels)",
            details={"limit": "depth", "max": rules.max_depth},
        )
    if rules.max_bytes is not None:
        size = len(
            json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode(
                "utf-8", "surrogatepass"
            )
        )
        if size > rules.max_bytes:
            raise ResultTooLarge(
                f"{name} returned {size} bytes, over its limit of {rules.max_bytes}",
                details={"limit": "bytes", "max": rules.max_bytes, "bytes": size},
            )


def nesting_depth(value: Any, *, stop_after: int) -> int:
    """Levels of objects and lists in ``value`` (iterative; stops past ``stop_after``)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            children: Any = node.values()
        elif isinstance(node, list):
            children = node
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > stop_after:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest
