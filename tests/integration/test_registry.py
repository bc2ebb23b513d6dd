"""The Postgres registry: registration rules and lifecycle-aware resolution."""

from __future__ import annotations

import uuid

import pytest

from toolfleet.contract.manifest import LifecycleState, ToolManifest
from toolfleet.errors import RegistrationError, ToolRemoved
from toolfleet.events.models import Effect
from toolfleet.registry.lookup import ToolLookup
from toolfleet.registry.store import RegistryStore
from toolfleet.settings import FleetSettings
from toolfleet.storage.postgres import create_pool

pytestmark = pytest.mark.integration


def manifest(tool_id: str, version: str, *, out: str = "integer") -> ToolManifest:
    return ToolManifest(
        tool_id=tool_id,
        version=version,
        effect=Effect.READ_ONLY,
        input_schema={"type": "object"},
        output_schema={"type": "object", "properties": {"v": {"type": out}}},
        redaction_allowlist=["v"],
        timeout_seconds=5,
    )


async def test_registration_is_idempotent_and_refuses_changed_schemas(
    settings: FleetSettings,
) -> None:
    pool = await create_pool(settings.database_url)
    try:
        store = RegistryStore(pool)
        tool_id = f"reg__t{uuid.uuid4().hex[:8]}"
        assert await store.register(manifest(tool_id, "1.0.0")) is True
        assert await store.register(manifest(tool_id, "1.0.0")) is False  # every executor at start
        with pytest.raises(RegistrationError, match="different schema"):
            await store.register(manifest(tool_id, "1.0.0", out="string"))
        assert await store.register(manifest(tool_id, "1.1.0", out="string")) is True
        assert [m.version for m in await store.versions(tool_id)] == ["1.1.0", "1.0.0"]
    finally:
        await pool.close()


async def test_lifecycle_drives_resolution(settings: FleetSettings) -> None:
    pool = await create_pool(settings.database_url)
    try:
        store = RegistryStore(pool)
        tool_id = f"reg__t{uuid.uuid4().hex[:8]}"
        for version in ("1.0.0", "2.0.0"):
            await store.register(manifest(tool_id, version))
        await store.set_lifecycle(tool_id, "1.0.0", LifecycleState.DEPRECATED, "moved to 2.x")
        lookup = ToolLookup(store, ttl_s=0)
        pinned = await lookup.resolve(tool_id, "^1.0.0")
        assert pinned.manifest.version == "1.0.0"
        assert pinned.warnings == [f"tool {tool_id}@1.0.0 is deprecated; use 2.0.0 (moved to 2.x)"]
        assert (await lookup.resolve(tool_id, "*")).warnings == []
        await store.set_lifecycle(tool_id, "1.0.0", LifecycleState.REMOVED)
        with pytest.raises(ToolRemoved):
            await lookup.resolve(tool_id, "1.0.0")
        # Removed versions leave the lists.
        detail = await store.tool(tool_id)
        assert detail is not None
        assert [v["version"] for v in detail["versions"]] == ["2.0.0"]
    finally:
        await pool.close()


async def test_a_manifest_stored_with_a_category_outside_the_fixed_set_still_resolves(
    settings: FleetSettings,
) -> None:
    pool = await create_pool(settings.database_url)
    try:
        store = RegistryStore(pool)
        tool_id = f"reg__t{uuid.uuid4().hex[:8]}"
        await store.register(manifest(tool_id, "1.0.0"))
        await pool.execute(
            """UPDATE tool_versions SET manifest = jsonb_set(manifest, '{category}', '"weather"')
               WHERE tool_id = $1""",
            tool_id,
        )
        (found,) = await store.versions(tool_id)
        assert (found.category, found.tags) == ("general", ["weather"])
    finally:
        await pool.close()
