"""Sources, their tools and their listings in Postgres (``tool_sources``,
``tool_source_tools``, ``source_listings``).

Recording a source's tools also registers each in the tool registry (so policy resolves
it and the validator checks its results) and deprecates the versions of a tool whose
schema changed, so ``*`` resolves to the current one. Storing a source requests a
listing of its tools, in the same transaction; :class:`ListingStore` is the queue
executors take listings from (:mod:`toolfleet.sources.listing`) and the API reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from toolfleet.contract.manifest import LifecycleState
from toolfleet.registry.store import RegistryStore
from toolfleet.sources.listing import ListingClaim, ListingResult
from toolfleet.sources.models import (
    LISTING_LIMITS,
    Discovery,
    ListingState,
    SourceDefinition,
    SourceListing,
    SourceTool,
    manifest_of,
)
from toolfleet.sources.rules import with_rules

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RecordedTools:
    """What one recording changed."""

    added: list[SourceTool]
    """Tool versions not known before."""
    new_tools: list[SourceTool]
    """Of those, tools whose id was not known before (a new tool, not a new schema)."""


class SourceStore:
    """The only sources code touching SQL."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._registry = RegistryStore(pool)

    @property
    def listings(self) -> ListingStore:
        """The listings of these sources."""
        return ListingStore(self._pool)

    async def put(self, source: SourceDefinition) -> SourceListing:
        """Store ``source`` (replacing one of its name) and request a listing of its tools."""
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                """INSERT INTO tool_sources
                       (name, tenant_id, kind, target, connection_id, definition)
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
            listing = await ListingStore.request_on(conn, source.name, via="add")
        assert listing is not None  # the source row is there: the same transaction wrote it
        return listing

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


def _listing(row: asyncpg.Record) -> SourceListing:
    return SourceListing(
        source=row["source_name"],
        tenant_id=row["tenant_id"],
        state=ListingState(row["state"]),
        request=row["request"],
        requested_at=row["requested_at"],
        attempts=row["attempts"],
        listed_at=row["listed_at"],
        listed_by=row["listed_by"],
        tools=row["tool_count"],
        error=row["error"],
        next_attempt_at=row["next_attempt_at"],
    )


class ListingStore:
    """``source_listings``: the API requests and reads listings, executors claim and
    answer them (:class:`toolfleet.sources.listing.ListingQueue`)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @staticmethod
    async def request_on(
        conn: PoolConnectionProxy, name: str, *, via: Discovery
    ) -> SourceListing | None:
        """Ask (again) for a listing of source ``name``, for its tenant; None: no such
        source. A claim on an earlier request no longer counts."""
        row = await conn.fetchrow(
            """INSERT INTO source_listings (source_name, tenant_id, requested_via)
                SELECT name, tenant_id, $2 FROM tool_sources WHERE name = $1
                ON CONFLICT (source_name) DO UPDATE SET
                    tenant_id = EXCLUDED.tenant_id, request = source_listings.request + 1,
                    state = 'pending', requested_at = now(),
                    requested_via = EXCLUDED.requested_via, attempts = 0,
                    claimed_by = NULL, claimed_until = NULL, next_attempt_at = NULL,
                    error = NULL
                RETURNING *""",
            name,
            via,
        )
        return None if row is None else _listing(row)

    async def request(self, name: str, *, via: Discovery = "refresh") -> SourceListing | None:
        async with self._pool.acquire() as conn:
            return await self.request_on(conn, name, via=via)

    async def get(self, name: str) -> SourceListing | None:
        row = await self._pool.fetchrow(
            "SELECT * FROM source_listings WHERE source_name = $1", name
        )
        return None if row is None else _listing(row)

    async def states(self) -> dict[str, ListingState]:
        """Every source's listing state, by source name."""
        rows = await self._pool.fetch("SELECT source_name, state FROM source_listings")
        return {r["source_name"]: ListingState(r["state"]) for r in rows}

    async def listed_here(self, listing: SourceListing, *, tools: int, by: str) -> SourceListing:
        """Mark the request ``listing`` answers ready with ``tools`` tools, listed by ``by``
        (an HTTP source's declared operations, listed where it is stored); a newer
        request is left as it is."""
        row = await self._pool.fetchrow(
            """UPDATE source_listings SET state = 'ready', listed_at = now(), listed_by = $3,
                    tool_count = $4, error = NULL, next_attempt_at = NULL,
                    claimed_by = NULL, claimed_until = NULL
                WHERE source_name = $1 AND request = $2
                RETURNING *""",
            listing.source,
            listing.request,
            by,
            tools,
        )
        return listing if row is None else _listing(row)

    async def listed_now(self, source: SourceDefinition, *, tools: int, by: str) -> bool:
        """Mark ``source``'s listing ready after a listing made outside the queue (a
        server's ``list_changed``), if ``source`` is the stored definition and no worker
        holds a claim on it (that worker answers); whether it was marked."""
        done = await self._pool.fetchval(
            """UPDATE source_listings l SET state = 'ready', listed_at = now(),
                   listed_by = $3, tool_count = $4, error = NULL, next_attempt_at = NULL
               FROM tool_sources s
               WHERE l.source_name = $1 AND s.name = l.source_name
                 AND s.definition = $2::jsonb AND l.claimed_by IS NULL
               RETURNING 1""",
            source.name,
            source.model_dump(mode="json"),
            by,
            tools,
        )
        return done is not None

    async def claim(self, worker: str, *, lease_margin_s: float) -> ListingClaim | None:
        row = await self._pool.fetchrow(
            """WITH due AS (
                   SELECT source_name FROM source_listings
                   WHERE (state = 'pending' OR (state = 'failed' AND next_attempt_at <= now()))
                     AND (claimed_until IS NULL OR claimed_until < now())
                   ORDER BY requested_at LIMIT 1
                   FOR UPDATE SKIP LOCKED)
               UPDATE source_listings l SET claimed_by = $1, attempts = l.attempts + 1,
                   claimed_until = now() + make_interval(secs =>
                       least((s.definition->>'timeout_s')::float8, $3) + $2)
               FROM due, tool_sources s
               WHERE l.source_name = due.source_name AND s.name = l.source_name
               RETURNING l.tenant_id, l.request, l.requested_via, l.attempts,
                   s.definition""",
            worker,
            lease_margin_s,
            LISTING_LIMITS.max_seconds,
        )
        if row is None:
            return None
        return ListingClaim(
            source=SourceDefinition.model_validate(row["definition"]),
            tenant_id=row["tenant_id"],
            request=row["request"],
            via=row["requested_via"],
            attempts=row["attempts"],
        )

    async def is_current(self, claim: ListingClaim, worker: str) -> bool:
        found = await self._pool.fetchval(
            """SELECT 1 FROM source_listings
               WHERE source_name = $1 AND request = $2 AND claimed_by = $3""",
            claim.source.name,
            claim.request,
            worker,
        )
        return found is not None

    async def finish(self, claim: ListingClaim, worker: str, result: ListingResult) -> bool:
        done = await self._pool.fetchval(
            """UPDATE source_listings SET
                   state = CASE WHEN $4::jsonb IS NULL THEN 'ready' ELSE 'failed' END,
                   listed_at = now(), listed_by = $3,
                   tool_count = coalesce($5, tool_count), error = $4::jsonb,
                   next_attempt_at = now() + make_interval(secs => $6::float8),
                   claimed_by = NULL, claimed_until = NULL
               WHERE source_name = $1 AND request = $2 AND claimed_by = $3
               RETURNING 1""",
            claim.source.name,
            claim.request,
            worker,
            None if result.error is None else result.error.model_dump(mode="json"),
            result.tools,
            result.retry_in_s,
        )
        return done is not None

    async def release(self, claim: ListingClaim, worker: str) -> None:
        await self._pool.execute(
            """UPDATE source_listings SET claimed_by = NULL, claimed_until = NULL,
                   attempts = greatest(attempts - 1, 0)
               WHERE source_name = $1 AND request = $2 AND claimed_by = $3""",
            claim.source.name,
            claim.request,
            worker,
        )
