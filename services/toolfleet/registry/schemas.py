"""JSON Schema 2020-12 validation, compiled once per schema (jsonschema-rs)."""

from __future__ import annotations

import json
from typing import Any

#: Keywords whose error messages name properties only, never the offending value.
_NAME_ONLY_KEYWORDS = frozenset({"required", "additionalProperties", "unevaluatedProperties"})


class CompiledSchemas:
    """Compiled validators keyed by the schema's canonical JSON."""

    def __init__(self, max_entries: int = 4096) -> None:
        self._validators: dict[str, Any] = {}
        self._max_entries = max_entries

    def validator(self, schema: dict[str, Any]) -> Any:
        key = json.dumps(schema, sort_keys=True, separators=(",", ":"))
        found = self._validators.get(key)
        if found is None:
            # Imported at the first schema compiled, not with this module: jsonschema-rs
            # is about 6 MB of resident memory once used, and the executor holds a
            # CompiledSchemas for the rare source tool only (issue 36: a worker stays
            # within 80 MB).
            import jsonschema_rs

            if len(self._validators) >= self._max_entries:
                self._validators.pop(next(iter(self._validators)))
            found = jsonschema_rs.Draft202012Validator(schema)
            self._validators[key] = found
        return found

    def errors(self, schema: dict[str, Any], instance: Any) -> list[dict[str, str]]:
        """Field-level errors; empty when ``instance`` is valid.

        Messages never quote the offending value: parameters and results may carry
        personal data, and these errors travel in outcomes and audit events.
        """
        validator = self.validator(schema)
        if validator.is_valid(instance):
            return []
        errors = []
        for err in validator.iter_errors(instance):
            keyword = str(err.schema_path[-1]) if err.schema_path else "schema"
            field = "/".join(str(p) for p in err.instance_path)
            if keyword in _NAME_ONLY_KEYWORDS:
                message = err.message
            else:
                message = f"value does not satisfy '{keyword}'"
                expected = _expected(schema, list(err.schema_path))
                if expected is not None:
                    message += f" (expected {expected})"
            errors.append({"field": field or "/", "message": message, "keyword": keyword})
            if len(errors) >= 50:
                break
        return errors


def _expected(schema: dict[str, Any], path: list[Any]) -> str | None:
    node: Any = schema
    for part in path:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None
    if isinstance(node, str | int | float | bool) or (
        isinstance(node, list) and all(isinstance(x, str) for x in node) and len(node) <= 10
    ):
        return json.dumps(node)
    return None
