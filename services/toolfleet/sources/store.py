"""Sources and their tools in Postgres (``tool_sources``, ``tool_source_tools``).

Recording a source's tools also registers each in the tool registry (so policy resolves
it and the validator checks its results) and deprecates the versions of a tool whose
schema changed, so ``*`` resolves to the current one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

import asyncpg

from toolfleet.registry.manifest import LifecycleState, SourceType, ToolManifest
from toolfleet.registry.store import RegistryStore
from toolfleet.sources.models import SourceDefinition, SourceTool
from toolfleet.sources.rules import with_rules

Discovery = Literal["add", "list_changed", "refresh"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RecordedTools:
    """What one recording changed."""

    added: list[SourceTool]
    """Tool versions not known before."""
    new_tools: list[SourceTool]
    """Of those, tools whose id was not known before (a new tool, not a new schema)."""


def manifest_of(tool: SourceTool) -> ToolManifest:
    return ToolManifest(
        tool_id=tool.tool_id,
        version=tool.version,
        effect=tool.effect,
        description=tool.description,
        tags=[f"source:{tool.source}"],
        source_type=SourceType(tool.source_type),
        input_schema=tool.input_schema,
        output_schema=tool.output_schema,
        redaction_allowlist=tool.redaction_allowlist,
        result_rules=tool.result_rules,
        timeout_seconds=tool.timeout_seconds,
    )


class SourceStore:
    """The only sources code touching SQL."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._registry = RegistryStore(pool)

    async def put(self, source: SourceDefinition) -> None:
        await self._pool.execute(
            """INSERT INTO tool_sources (name, tenant_id, kind, target, connection_id, definition)
               VALUES ($1, $2, $3, $4, $5, $6)
               ON CONFLICT (name) DO UPDATE SET tenant_id = EXCLUDED.tenant_id,
                   kind = EXCLUDED.kind, target = EXCLUDED.target,
                   connection_id = EXCLUDED.connection_id,
                   definition = EXCLUDED.definition, updated_at = now()""",
            source.name,
            source.tenant_id,
            source.kind.value,
            source.target,
            source.connection_id,
            source.model_dump(mode="json"),
        )

    async def update(
        self, name: str, change: Callable[[SourceDefinition], SourceDefinition]
    ) -> SourceDefinition | None:
        """Store ``change(source)`` in place of the source, read and written under its
        row lock (two operators configuring two tools both keep their change)."""
        async with self._pool.acquire() as conn, conn.transaction():
            raw = await conn.fetchval(
                "SELECT definition FROM tool_sources WHERE name = $1 FOR UPDATE", name
            )
            if raw is None:
                return None
            updated = change(SourceDefinition.model_validate(raw))
            await conn.execute(
                "UPDATE tool_sources SET definition = $2, updated_at = now() WHERE name = $1",
                name,
                updated.model_dump(mode="json"),
            )
        return updated

    async def get(self, name: str) -> SourceDefinition | None:
        raw = await self._pool.fetchval("SELECT definition FROM tool_sources WHERE name = $1", name)
        return None if raw is None else SourceDefinition.model_validate(raw)

    async def sources(self, tenant_id: str | None = None) -> list[SourceDefinition]:
        """Every source, or those a tenant may use (its own and the global ones)."""
        rows = await self._pool.fetch(
            """SELECT definition AS d FROM tool_sources
               WHERE $1::text IS NULL OR tenant_id IN ($1, '*') ORDER BY name""",
            tenant_id,
        )
        return [SourceDefinition.model_validate(r["d"]) for r in rows]

    async def unlisted(self) -> list[SourceDefinition]:
        """Sources none of whose tools is known yet (added while unreachable)."""
        rows = await self._pool.fetch(
            """SELECT s.definition AS d FROM tool_sources s
               WHERE NOT EXISTS (SELECT 1 FROM tool_source_tools t WHERE t.source_name = s.name)
               ORDER BY s.name"""
        )
        return [SourceDefinition.model_validate(r["d"]) for r in rows]

    async def remove(self, name: str) -> bool:
        """Forget the source; its tools' versions are marked removed in the registry."""
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT tool_id, version FROM tool_source_tools WHERE source_name = $1", name
            )
            deleted = await conn.fetchval(
                "DELETE FROM tool_sources WHERE name = $1 RETURNING name", name
            )
        for row in rows:
            await self._registry.set_lifecycle(
                row["tool_id"], row["version"], LifecycleState.REMOVED, "its source was removed"
            )
        return deleted is not None

    async def tools(self, name: str) -> list[SourceTool]:
        rows = await self._pool.fetch(
            """SELECT tool AS t FROM tool_source_tools WHERE source_name = $1
               ORDER BY tool_id, created_at""",
            name,
        )
        return [SourceTool.model_validate(r["t"]) for r in rows]

    async def tool_ids(self) -> frozenset[str]:
        """Ids of every tool registered from a source (untrusted: named exactly or not at all)."""
        rows = await self._pool.fetch("SELECT DISTINCT tool_id FROM tool_source_tools")
        return frozenset(r["tool_id"] for r in rows)

    async def id_conflicts(self, source: str, tool_ids: Collection[str]) -> dict[str, str]:
        """Which of ``tool_ids`` (those ``source`` would register) are taken, and by what:
        another source's tool (``source:NAME``) or a native tool (``native``)."""
        rows = await self._pool.fetch(
            """SELECT tool_id, 'source:' || source_name AS owner FROM tool_source_tools
               WHERE tool_id = ANY($1::text[]) AND source_name <> $2
               UNION
               SELECT tool_id, 'native' FROM tool_versions
               WHERE tool_id = ANY($1::text[])
                 AND coalesce(manifest->>'source_type', 'native') = 'native'""",
            list(tool_ids),
            source,
        )
        return {r["tool_id"]: r["owner"] for r in rows}

    async def tool(self, tool_id: str, version: str) -> tuple[SourceTool, SourceDefinition] | None:
        row = await self._pool.fetchrow(
            """SELECT t.tool AS t, s.definition AS d
               FROM tool_source_tools t JOIN tool_sources s ON s.name = t.source_name
               WHERE t.tool_id = $1 AND t.version = $2""",
            tool_id,
            version,
        )
        if row is None:
            return None
        return (
            SourceTool.model_validate(row["t"]),
            SourceDefinition.model_validate(row["d"]),
        )

    async def restate_rules(self, name: str) -> list[SourceTool]:
        """Give every recorded version of the source's tools the allowlist, result rules
        and effect the source now sets, here and in the registry (which the validator reads),
        under the source's row lock; return the versions that changed."""
        changed: list[SourceTool] = []
        async with self._pool.acquire() as conn, conn.transaction():
            raw = await conn.fetchval(
                "SELECT definition FROM tool_sources WHERE name = $1 FOR UPDATE", name
            )
            if raw is None:
                return []
            source = SourceDefinition.model_validate(raw)
            rows = await conn.fetch(
                "SELECT tool AS t FROM tool_source_tools WHERE source_name = $1", name
            )
            for row in rows:
                stored = SourceTool.model_validate(row["t"])
                wanted = with_rules(source, stored)
                if wanted == stored:
                    continue
                await conn.execute(
                    "UPDATE tool_source_tools SET tool = $3 WHERE tool_id = $1 AND version = $2",
                    wanted.tool_id,
                    wanted.version,
                    wanted.model_dump(mode="json"),
                )
                await self._registry.set_result_rules(
                    wanted.tool_id,
                    wanted.version,
                    redaction_allowlist=wanted.redaction_allowlist,
                    result_rules=wanted.result_rules,
                    conn=conn,
                )
                if wanted.effect != stored.effect:
                    await self._registry.set_effect(manifest_of(wanted), conn=conn)
                changed.append(wanted)
        return changed

    async def record(self, tools: list[SourceTool], *, via: Discovery) -> RecordedTools:
        """Store and register ``tools``; return what is new.

        A tool whose id another source or a native tool holds is left out (logged):
        ``sources add`` refuses such a source, but a source stored another way, or a
        native tool deployed later, must not take over the id.
        """
        added: list[SourceTool] = []
        new_tools: list[SourceTool] = []
        taken: dict[str, str] = {}
        for source in {t.source for t in tools}:
            taken |= await self.id_conflicts(
                source, [t.tool_id for t in tools if t.source == source]
            )
        for tool in tools:
            if tool.tool_id in taken:
                log.warning(
                    "a source tool's id is taken; not registered",
                    extra={
                        "source": tool.source,
                        "tool_id": tool.tool_id,
                        "holder": taken[tool.tool_id],
                    },
                )
                continue
            async with self._pool.acquire() as conn, conn.transaction():
                known = await conn.fetch(
                    "SELECT version FROM tool_source_tools WHERE tool_id = $1", tool.tool_id
                )
                inserted = await conn.fetchval(
                    """INSERT INTO tool_source_tools
                           (tool_id, version, source_name, remote_name, discovered_via, tool)
                       VALUES ($1, $2, $3, $4, $5, $6)
                       ON CONFLICT (tool_id, version) DO NOTHING RETURNING tool_id""",
                    tool.tool_id,
                    tool.version,
                    tool.source,
                    tool.remote_name,
                    via,
                    tool.model_dump(mode="json"),
                )
            if inserted is None:
                continue
            added.append(tool)
            if not known:
                new_tools.append(tool)
            # A version the registry kept from an earlier recording (its source removed
            # and added again) takes this recording's effect, so registering it agrees.
            await self._registry.set_effect(manifest_of(tool))
            await self._registry.register(manifest_of(tool))
            for row in known:
                await self._registry.set_lifecycle(
                    tool.tool_id,
                    row["version"],
                    LifecycleState.DEPRECATED,
                    f"the source's schema changed; use {tool.version}",
                )
        return RecordedTools(added=added, new_tools=new_tools)
