"""The tool registry: manifests in Postgres, semver resolution, compiled schemas."""

from toolfleet.registry.lookup import ResolvedTool, ToolLookup
from toolfleet.registry.manifest import LifecycleState, ToolManifest
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.registry.store import RegistryStore

__all__ = [
    "CompiledSchemas",
    "LifecycleState",
    "RegistryStore",
    "ResolvedTool",
    "ToolLookup",
    "ToolManifest",
]
