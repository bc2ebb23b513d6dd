"""The tool manifest, where the registry keeps it.

:class:`ToolManifest` is a published shape (``schemas/manifest.json``, ``GET
/v1/tools/{id}``), so it is defined in :mod:`toolfleet.contract.manifest`, below the
registry and the client; this module re-exports it for the code and the docs that name
it here.
"""

from toolfleet.contract.manifest import (
    LIFECYCLE_ORDER,
    CircuitSettings,
    FilesystemAccess,
    LifecycleState,
    ResourceDefaults,
    RetrySettings,
    SourceType,
    ToolCategory,
    ToolManifest,
    ToolPermissions,
    effective_state,
    schema_hash,
)

__all__ = [
    "LIFECYCLE_ORDER",
    "CircuitSettings",
    "FilesystemAccess",
    "LifecycleState",
    "ResourceDefaults",
    "RetrySettings",
    "SourceType",
    "ToolCategory",
    "ToolManifest",
    "ToolPermissions",
    "effective_state",
    "schema_hash",
]
