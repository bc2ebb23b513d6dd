"""The tool registry in Postgres (``tool_definitions``, ``tool_versions``)."""

from __future__ import annotations

from typing import Any

import asyncpg
import semver

from toolfleet.errors import RegistrationError, ToolNotFound
from toolfleet.registry.manifest import LifecycleState, ToolManifest
from toolfleet.storage.pg_text import escape_array, unescape_array


class RegistryStore:
    """Registers manifests and reads them back. The only registry code touching SQL."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def register(self, manifest: ToolManifest) -> bool:
        """Register one version; return True if it was new.

        Re-registering the same id and version with the same schemas is a no-op (every
        executor does it at start); with different schemas it is refused.
        """
        v = semver.Version.parse(manifest.version)
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                """INSERT INTO tool_definitions
                       (tool_id, namespace, name, description, category, tags)
                   VALUES ($1, $2, $3, $4, $5, $6)
                   ON CONFLICT (tool_id) DO UPDATE SET description = EXCLUDED.description,
                       category = EXCLUDED.category, tags = EXCLUDED.tags, updated_at = now()""",
                manifest.tool_id,
                manifest.namespace,
                manifest.tool_id.split("__", 1)[1],
                manifest.description,
                manifest.category,
                escape_array(manifest.tags),
            )
            existing = await conn.fetchval(
                """SELECT schema_hash FROM tool_versions
                   WHERE tool_id = $1 AND version = $2 FOR UPDATE""",
                manifest.tool_id,
                manifest.version,
            )
            if existing is not None:
                if existing != manifest.schema_hash:
                    raise RegistrationError(
                        f"{manifest.tool_id}@{manifest.version} is already registered with a "
                        "different schema; publish a new version instead"
                    )
                return False
            await conn.execute(
                """INSERT INTO tool_versions (tool_id, version, major, minor, patch, prerelease,
                       lifecycle_state, deprecation_message, effect, input_schema, output_schema,
                       redaction_allowlist, timeout_seconds, schema_hash, manifest)
                   VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15)""",
                manifest.tool_id,
                manifest.version,
                v.major,
                v.minor,
                v.patch,
                v.prerelease or "",
                manifest.lifecycle_state.value,
                manifest.deprecation_message,
                manifest.effect.value,
                manifest.input_schema,
                manifest.output_schema,
                escape_array(manifest.redaction_allowlist),
                manifest.timeout_seconds,
                manifest.schema_hash,
                manifest.model_dump(mode="json"),
            )
            return True

    async def set_lifecycle(
        self, tool_id: str, version: str, state: LifecycleState, message: str | None = None
    ) -> None:
        updated = await self._pool.execute(
            """UPDATE tool_versions SET lifecycle_state = $3, deprecation_message = $4,
                   updated_at = now() WHERE tool_id = $1 AND version = $2""",
            tool_id,
            version,
            state.value,
            message,
        )
        if updated.endswith(" 0"):
            raise ToolNotFound(f"{tool_id}@{version} is not registered")

    async def versions(self, tool_id: str) -> list[ToolManifest]:
        rows = await self._pool.fetch(
            """SELECT manifest, lifecycle_state, deprecation_message FROM tool_versions
               WHERE tool_id = $1 ORDER BY major DESC, minor DESC, patch DESC""",
            tool_id,
        )
        return [_manifest(r) for r in rows]

    async def list_tools(
        self,
        *,
        category: str | None = None,
        tag: str | None = None,
        q: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[dict[str, Any]], int]:
        """Tool summaries matching the filters, and the total count."""
        where: list[str] = ["TRUE"]
        args: list[object] = []
        if category:
            args.append(category)
            where.append(f"d.category = ${len(args)}")
        if tag:
            args.append(tag)
            where.append(f"${len(args)} = ANY(d.tags)")
        if q:
            args.append(f"%{q.lower()}%")
            where.append(
                f"(lower(d.tool_id) LIKE ${len(args)} OR lower(d.description) LIKE ${len(args)})"
            )
        clause = " AND ".join(where)
        # Only placeholders ($n) are interpolated into the SQL; values travel as arguments.
        count_sql = f"SELECT count(*) FROM tool_definitions d WHERE {clause}"  # noqa: S608
        total = await self._pool.fetchval(count_sql, *args)
        args += [limit, offset]
        rows = await self._pool.fetch(
            f"""SELECT d.tool_id, d.description, d.category, d.tags,
                       coalesce(json_agg(json_build_object('version', v.version,
                           'lifecycle_state', v.lifecycle_state, 'effect', v.effect)
                           ORDER BY v.major DESC, v.minor DESC, v.patch DESC)
                           FILTER (WHERE v.version IS NOT NULL), '[]') AS versions
                FROM tool_definitions d LEFT JOIN tool_versions v USING (tool_id)
                WHERE {clause} GROUP BY d.tool_id ORDER BY d.tool_id
                LIMIT ${len(args) - 1} OFFSET ${len(args)}""",  # noqa: S608 - placeholders only
            *args,
        )
        return [_definition(r) for r in rows], int(total)

    async def tool(self, tool_id: str) -> dict[str, Any] | None:
        row = await self._pool.fetchrow(
            "SELECT tool_id, description, category, tags FROM tool_definitions WHERE tool_id = $1",
            tool_id,
        )
        if row is None:
            return None
        return {
            **_definition(row),
            "versions": [m.model_dump(mode="json") for m in await self.versions(tool_id)],
        }


def _definition(row: asyncpg.Record) -> dict[str, Any]:
    return {**dict(row), "tags": unescape_array(row["tags"])}


def _manifest(row: asyncpg.Record) -> ToolManifest:
    # The lifecycle lives in its own columns: operators change it without re-registering.
    return ToolManifest.model_validate(
        {
            **row["manifest"],
            "lifecycle_state": row["lifecycle_state"],
            "deprecation_message": row["deprecation_message"],
        }
    )
