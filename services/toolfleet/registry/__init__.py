"""The tool registry: manifests in Postgres, semver resolution, compiled schemas.

Exports load on first use: the SDK reads manifests, schemas and redaction from here
on a core install, which has no Postgres driver (``RegistryStore`` needs the ``fleet``
extra).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolfleet.contract.manifest import LifecycleState, ToolManifest
    from toolfleet.registry.lookup import ResolvedTool, ToolLookup
    from toolfleet.registry.schemas import CompiledSchemas
    from toolfleet.registry.store import RegistryStore

_EXPORTS = {
    "CompiledSchemas": "toolfleet.registry.schemas",
    "LifecycleState": "toolfleet.contract.manifest",
    "RegistryStore": "toolfleet.registry.store",
    "ResolvedTool": "toolfleet.registry.lookup",
    "ToolLookup": "toolfleet.registry.lookup",
    "ToolManifest": "toolfleet.contract.manifest",
}

__all__ = [
    "CompiledSchemas",
    "LifecycleState",
    "RegistryStore",
    "ResolvedTool",
    "ToolLookup",
    "ToolManifest",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
