"""Input schemas as policy checks them: the compiled validator found by the schema object.

:class:`~toolfleet.registry.schemas.CompiledSchemas` finds a validator by the schema's
canonical JSON, which it writes out on every call: for policy, which checks every
request against a manifest that :class:`~toolfleet.registry.lookup.ToolLookup` keeps
for seconds, that was more work than the check itself. The manifests' schema dicts are
never changed after loading, so the same object means the same schema.
"""

from __future__ import annotations

from typing import Any

from toolfleet.registry.schemas import CompiledSchemas

__all__ = ["ManifestSchemas"]


class ManifestSchemas(CompiledSchemas):
    """:class:`CompiledSchemas` that first looks a schema up by identity.

    An entry holds its schema, so the ``id`` it is found by is not reused meanwhile;
    a reloaded manifest (a new dict) is found by its text as before.
    """

    def __init__(self, max_entries: int = 4096) -> None:
        super().__init__(max_entries)
        self._by_object: dict[int, tuple[dict[str, Any], Any]] = {}
        self._max_objects = max_entries

    def validator(self, schema: dict[str, Any]) -> Any:
        hit = self._by_object.get(id(schema))
        if hit is not None and hit[0] is schema:
            return hit[1]
        found = super().validator(schema)
        if len(self._by_object) >= self._max_objects:
            self._by_object.clear()
        self._by_object[id(schema)] = (schema, found)
        return found
