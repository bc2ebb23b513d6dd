"""The tool registry in Postgres (``tool_definitions``, ``tool_versions``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import asyncpg
import semver
from asyncpg.pool import PoolConnectionProxy

from toolfleet.contract.manifest import (
    LIFECYCLE_ORDER,
    LifecycleState,
    ToolCategory,
    ToolManifest,
    effective_state,
)
from toolfleet.contract.result_rules import ResultRules
from toolfleet.errors import InvalidParameters, RegistrationError, StateConflict, ToolNotFound
from toolfleet.registry.search import (
    MIN_SCORE,
    Match,
    TextEmbedder,
    ToolDocument,
    embedding_tag,
    hybrid_rank,
    parameters_of,
    shared_embedder,
    tool_text,
)
from toolfleet.registry.versions import sunset_follows
from toolfleet.storage.pg_text import escape_array, unescape_array

log = logging.getLogger(__name__)

#: Rows hidden from every list: a removed version is gone for clients.
_VISIBLE = "v.lifecycle_state <> 'removed'"
_LISTED = f"EXISTS (SELECT 1 FROM tool_versions v WHERE v.tool_id = d.tool_id AND {_VISIBLE})"  # noqa: S608 - constant


@dataclass(frozen=True, slots=True, kw_only=True)
class LifecycleChange:
    """One operator's move of one version along ``active → deprecated → sunset → removed``."""

    tool_id: str
    version: str
    state: LifecycleState
    operator: str
    """Subject of the operator's token; stored and audited."""
    sunset_date: datetime | None = None
    """``deprecated``: the announced sunset; ``sunset``: when it takes effect (default now)."""
    deprecation_date: datetime | None = None
    """From when callers are warned (default: as stored, else now); must precede the sunset."""
    deprecated_in_favor_of: str | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LifecycleChanged:
    """What a change did: the version's manifest after it, and the state before."""

    manifest: ToolManifest
    previous_state: LifecycleState


class RegistryStore:
    """Registers manifests and reads them back. The only registry code touching SQL."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        embedder: TextEmbedder | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._pool = pool
        self._embedder = embedder
        self._clock = clock
        self._vector_schema: str | None = None
        self._detected = False

    @property
    def embedder(self) -> TextEmbedder:
        if self._embedder is None:
            self._embedder = shared_embedder()
        return self._embedder

    async def _embed(self, texts: list[str]) -> list[list[float]]:
        # Tokenizing and pooling are CPU work; keep the event loop free.
        return await asyncio.to_thread(self.embedder.embed, texts)

    async def register(self, manifest: ToolManifest) -> bool:
        """Register one version; return True if it was new.

        Re-registering the same id and version with the same schemas is a no-op (every
        executor does it at start); with different schemas it is refused. No embedding
        is computed here (executors register and must not load the model): a definition
        whose words changed loses its vector, and search embeds it on first use
        (:meth:`_documents`).
        """
        v = semver.Version.parse(manifest.version)
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                """INSERT INTO tool_definitions
                       (tool_id, namespace, name, description, category, tags)
                   VALUES ($1, $2, $3, $4, $5, $6)
                   ON CONFLICT (tool_id) DO UPDATE SET description = EXCLUDED.description,
                       category = EXCLUDED.category, tags = EXCLUDED.tags,
                       embedding = CASE WHEN (tool_definitions.description,
                               tool_definitions.category, tool_definitions.tags)
                           IS NOT DISTINCT FROM (EXCLUDED.description, EXCLUDED.category,
                               EXCLUDED.tags)
                           THEN tool_definitions.embedding END,
                       embedding_model = CASE WHEN (tool_definitions.description,
                               tool_definitions.category, tool_definitions.tags)
                           IS NOT DISTINCT FROM (EXCLUDED.description, EXCLUDED.category,
                               EXCLUDED.tags)
                           THEN tool_definitions.embedding_model END,
                       updated_at = now()""",
                manifest.tool_id,
                manifest.namespace,
                manifest.tool_id.split("__", 1)[1],
                manifest.description,
                manifest.category.value,
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
                await _restate_pool(conn, manifest)
                await _restate_keywords(conn, manifest)
                return False
            await conn.execute(
                """INSERT INTO tool_versions (tool_id, version, major, minor, patch, prerelease,
                       lifecycle_state, deprecation_message, effect, input_schema, output_schema,
                       redaction_allowlist, timeout_seconds, schema_hash, manifest,
                       requires_approval, pool)
                   VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17)""",
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
                manifest.requires_approval,
                manifest.pool,
            )
            return True

    async def change_lifecycle(self, change: LifecycleChange) -> LifecycleChanged:
        """Move one version forward in its lifecycle (or restate its dates in place).

        Raises:
            ToolNotFound: no such tool version.
            StateConflict: the move goes backwards, or the version is removed.
            InvalidParameters: the successor is not a registered, callable version/tool,
                or the sunset would not come after the deprecation.
        """
        now = self._clock()
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                """SELECT lifecycle_state, deprecation_date, sunset_date FROM tool_versions
                   WHERE tool_id = $1 AND version = $2 FOR UPDATE""",
                change.tool_id,
                change.version,
            )
            if row is None:
                raise ToolNotFound(
                    f"{change.tool_id}@{change.version} is not registered",
                    details={"tool_id": change.tool_id},
                )
            previous = LifecycleState(row["lifecycle_state"])
            if previous is LifecycleState.REMOVED or LIFECYCLE_ORDER.index(
                change.state
            ) < LIFECYCLE_ORDER.index(previous):
                raise StateConflict(
                    f"{change.tool_id}@{change.version} is {previous.value}; a version only "
                    "moves forward (active → deprecated → sunset → removed)",
                    details={"tool_id": change.tool_id, "lifecycle_state": previous.value},
                )
            successor = change.deprecated_in_favor_of
            if successor is not None:
                await _check_successor(conn, change.tool_id, change.version, successor)
            deprecation_date = change.deprecation_date or row["deprecation_date"] or now
            sunset_date = change.sunset_date or row["sunset_date"]
            if change.state is LifecycleState.SUNSET and change.sunset_date is None:
                # Sunset now: a deprecation announced for later takes effect now too.
                sunset_date = min(sunset_date, now) if sunset_date is not None else now
                if change.deprecation_date is None:
                    deprecation_date = min(deprecation_date, sunset_date)
            if sunset_date is not None and not sunset_follows(
                deprecation_date, sunset_date, state=change.state
            ):
                raise InvalidParameters(
                    f"sunset_date ({sunset_date.isoformat()}) must come after deprecation_date "
                    f"({deprecation_date.isoformat()})",
                    details={
                        "tool_id": change.tool_id,
                        "deprecation_date": deprecation_date.isoformat(),
                        "sunset_date": sunset_date.isoformat(),
                    },
                )
            await conn.execute(
                """UPDATE tool_versions SET lifecycle_state = $3,
                       deprecation_message = coalesce($4, deprecation_message),
                       deprecation_date = $5, sunset_date = $6,
                       deprecated_in_favor_of = coalesce($7, deprecated_in_favor_of),
                       lifecycle_changed_by = $8, lifecycle_changed_at = $9, updated_at = now()
                   WHERE tool_id = $1 AND version = $2""",
                change.tool_id,
                change.version,
                change.state.value,
                change.message,
                deprecation_date,
                sunset_date,
                successor,
                change.operator,
                now,
            )
        manifest = next(
            m for m in await self.versions(change.tool_id) if m.version == change.version
        )
        return LifecycleChanged(manifest=manifest, previous_state=previous)

    async def set_lifecycle(
        self, tool_id: str, version: str, state: LifecycleState, message: str | None = None
    ) -> None:
        """Set the state as stored, with no checks (test fixtures and migrations)."""
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

    async def set_result_rules(
        self,
        tool_id: str,
        version: str,
        *,
        redaction_allowlist: list[str],
        result_rules: ResultRules,
        conn: PoolConnectionProxy | None = None,
    ) -> None:
        """Restate what clients see of one version's results (an operator's rules for a
        source tool); the schemas, so the version's contract, do not change. ``conn``:
        inside the caller's transaction."""
        await (conn or self._pool).execute(
            """UPDATE tool_versions SET redaction_allowlist = $3,
                   manifest = manifest || jsonb_build_object(
                       'redaction_allowlist', $4::jsonb, 'result_rules', $5::jsonb),
                   updated_at = now()
               WHERE tool_id = $1 AND version = $2""",
            tool_id,
            version,
            escape_array(redaction_allowlist),
            redaction_allowlist,
            result_rules.model_dump(mode="json"),
        )

    async def set_effect(
        self, manifest: ToolManifest, *, conn: PoolConnectionProxy | None = None
    ) -> None:
        """Restate one version's effect as ``manifest`` has it (an operator's word on a
        source tool): the effect column, the manifest and the schema hash that covers it.
        ``conn``: inside the caller's transaction."""
        await (conn or self._pool).execute(
            """UPDATE tool_versions SET effect = $3, schema_hash = $4,
                   manifest = manifest || jsonb_build_object('effect', $3::text),
                   updated_at = now()
               WHERE tool_id = $1 AND version = $2""",
            manifest.tool_id,
            manifest.version,
            manifest.effect.value,
            manifest.schema_hash,
        )

    async def versions(self, tool_id: str) -> list[ToolManifest]:
        rows = await self._pool.fetch(
            """SELECT manifest, lifecycle_state, deprecation_message, deprecation_date,
                      sunset_date, deprecated_in_favor_of FROM tool_versions
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
        min_score: float = MIN_SCORE,
        limit: int = 50,
        offset: int = 0,
        shows: Callable[[str], bool] | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        """Tool summaries matching the filters, and the total count.

        Without ``q`` by tool id; with it, the tools scoring at least ``min_score``, most
        similar in meaning first, each with its ``score`` and ``low_relevance``. Removed
        versions, and tools with nothing else, are left out. ``shows``: with ``q``, rank
        only the tools the caller may see, so the best few of a query nothing answers
        are the caller's own and other tenants' tools never weigh on its ranking.
        """
        where: list[str] = [_LISTED]
        args: list[object] = []
        if category:
            args.append(category)
            where.append(f"d.category = ${len(args)}")
        if tag:
            args.append(tag)
            where.append(f"${len(args)} = ANY(d.tags)")
        clause = " AND ".join(where)
        if q:
            matches = await self._ranked(q, clause, args, min_score=min_score, shows=shows)
            page = {m.tool_id: m for m in matches[offset : offset + limit]}
            summaries = await self._summaries(list(page))
            return [
                {
                    **summary,
                    "score": round(page[summary["tool_id"]].score, 4),
                    "low_relevance": page[summary["tool_id"]].low_relevance,
                }
                for summary in summaries
            ], len(matches)
        # Only placeholders ($n) are interpolated into the SQL; values travel as arguments.
        count_sql = f"SELECT count(*) FROM tool_definitions d WHERE {clause}"  # noqa: S608
        total = await self._pool.fetchval(count_sql, *args)
        args += [limit, offset]
        ids = await self._pool.fetch(
            f"""SELECT d.tool_id FROM tool_definitions d WHERE {clause} ORDER BY d.tool_id
                LIMIT ${len(args) - 1} OFFSET ${len(args)}""",  # noqa: S608 - placeholders only
            *args,
        )
        return await self._summaries([r["tool_id"] for r in ids]), int(total)

    async def _ranked(
        self,
        q: str,
        clause: str,
        args: list[object],
        *,
        min_score: float,
        shows: Callable[[str], bool] | None = None,
    ) -> list[Match]:
        """The tools matching ``clause`` (and ``shows``) as
        :func:`~toolfleet.registry.search.hybrid_rank` ranks them: scoring ``min_score``
        or, if none does, the best few marked weak."""
        docs = await self._documents(clause, args)
        if shows is not None:
            docs = [d for d in docs if shows(d.tool_id)]
        (query,) = await self._embed([q])
        similarities: dict[str, float] | None = None
        schema = await self.detect_pgvector()
        if schema is not None:
            rows = await self._pool.fetch(
                pgvector_ranking(clause, arg_count=len(args), schema=schema),
                *args,
                query,
                -2.0,  # every tool: the floor applies to the blended score
            )
            similarities = {r["tool_id"]: float(r["score"]) for r in rows}
        return hybrid_rank(q, query, docs, similarities=similarities, min_score=min_score)

    async def _documents(self, clause: str, args: list[object]) -> list[ToolDocument]:
        """What search reads of each tool matching ``clause`` (keywords and parameters
        from its newest listed version). Tools whose text changed since their vector was
        computed (or that have none: registered before search, or with another model)
        are embedded again first."""
        rows = await self._pool.fetch(
            f"""SELECT d.tool_id, d.description, d.category, d.tags, d.embedding,
                       d.embedding_model, v.manifest -> 'keywords' AS keywords,
                       v.input_schema -> 'properties' AS properties
                FROM tool_definitions d LEFT JOIN LATERAL (
                    SELECT v.manifest, v.input_schema FROM tool_versions v
                    WHERE v.tool_id = d.tool_id AND {_VISIBLE}
                    ORDER BY v.major DESC, v.minor DESC, v.patch DESC LIMIT 1) v ON true
                WHERE {clause} ORDER BY d.tool_id""",  # noqa: S608 - placeholders only
            *args,
        )
        docs = [
            ToolDocument(
                tool_id=r["tool_id"],
                description=r["description"] or "",
                category=r["category"] or "",
                tags=tuple(_tags(r["tags"])),
                keywords=tuple(str(k) for k in r["keywords"] or ()),
                parameters=parameters_of({"properties": r["properties"] or {}}),
                embedding=r["embedding"],
            )
            for r in rows
        ]
        model = self.embedder.model_name
        texts = [tool_text(d.tool_id, d.description, d.category, d.tags, d.keywords) for d in docs]
        tags = [embedding_tag(model, text) for text in texts]
        stale = [
            i
            for i, (r, tag) in enumerate(zip(rows, tags, strict=True))
            if r["embedding"] is None or r["embedding_model"] != tag
        ]
        if not stale:
            return docs
        vectors = await self._embed([texts[i] for i in stale])
        await self._pool.executemany(
            "UPDATE tool_definitions SET embedding = $2, embedding_model = $3 WHERE tool_id = $1",
            [(docs[i].tool_id, v, tags[i]) for i, v in zip(stale, vectors, strict=True)],
        )
        log.info("tool embeddings computed", extra={"tools": len(stale)})
        for i, vector in zip(stale, vectors, strict=True):
            docs[i] = replace(docs[i], embedding=vector)
        return docs

    async def detect_pgvector(self) -> str | None:
        """The schema of the ``vector`` extension in this database, or None without it.

        Asked once (the API asks at start-up and logs how search ranks); the queries
        name the extension's schema, so it ranks whatever the ``search_path``.
        """
        if not self._detected:
            self._vector_schema = await self._pool.fetchval(
                """SELECT n.nspname FROM pg_extension e
                   JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"""
            )
            self._detected = True
            backend = "pgvector" if self._vector_schema else "in_process"
            log.info("tool search ranking", extra={"backend": backend})
        return self._vector_schema

    async def _summaries(self, tool_ids: list[str]) -> list[dict[str, Any]]:
        """Summaries of ``tool_ids``, in that order."""
        if not tool_ids:
            return []
        rows = await self._pool.fetch(
            f"""SELECT d.tool_id, d.name, d.description, d.category, d.tags,
                       coalesce(json_agg(json_build_object('version', v.version,
                           'lifecycle_state', v.lifecycle_state, 'effect', v.effect,
                           'requires_approval', v.requires_approval,
                           'deprecation_date', v.deprecation_date,
                           'sunset_date', v.sunset_date,
                           'deprecated_in_favor_of', v.deprecated_in_favor_of)
                           ORDER BY v.major DESC, v.minor DESC, v.patch DESC)
                           FILTER (WHERE v.version IS NOT NULL AND {_VISIBLE}), '[]') AS versions
                FROM tool_definitions d LEFT JOIN tool_versions v USING (tool_id)
                WHERE d.tool_id = ANY($1::text[]) GROUP BY d.tool_id""",  # noqa: S608 - constant
            tool_ids,
        )
        now = self._clock()
        by_id = {r["tool_id"]: _summary(r, now) for r in rows}
        return [by_id[t] for t in tool_ids if t in by_id]

    async def tool(self, tool_id: str) -> dict[str, Any] | None:
        """One tool with every version's manifest but the removed ones, newest first;
        ``None`` when no version is left, as the lists leave such a tool out."""
        found = await self._summaries([tool_id])
        if not found:
            return None
        now = self._clock()
        versions = [
            m.model_copy(update={"lifecycle_state": m.state_at(now)}).model_dump(mode="json")
            for m in await self.versions(tool_id)
            if m.lifecycle_state is not LifecycleState.REMOVED
        ]
        if not versions:
            return None
        return {**found[0], "versions": versions}


def pgvector_ranking(clause: str, *, arg_count: int, schema: str) -> str:
    """SQL ranking the tools matching ``clause`` (placeholders ``$1..$arg_count``) by
    cosine similarity to ``$arg_count+1`` (a ``real[]``), those scoring at least
    ``$arg_count+2``, best first (ties by id); columns ``tool_id``, ``score``."""
    ext = '"' + schema.replace('"', '""') + '"'
    query, floor = arg_count + 1, arg_count + 2
    distance = f"d.embedding::{ext}.vector OPERATOR({ext}.<=>) ${query}::real[]::{ext}.vector"
    # Only placeholders and the quoted schema are interpolated; values travel as arguments.
    return f"""SELECT tool_id, score FROM (
                   SELECT d.tool_id, 1 - ({distance}) AS score FROM tool_definitions d
                   WHERE {clause} AND d.embedding IS NOT NULL) AS ranked
               WHERE score >= ${floor} ORDER BY score DESC, tool_id"""  # noqa: S608


async def _check_successor(
    conn: asyncpg.Connection | PoolConnectionProxy, tool_id: str, version: str, successor: str
) -> None:
    """A successor is a version of this tool (``2.0.0``) or a tool (``acme__x[@1.0.0]``)."""
    other, _, other_version = successor.partition("@")
    if "__" not in other:
        other, other_version = tool_id, successor
    if other == tool_id and other_version == version:
        raise InvalidParameters("a version cannot be deprecated in favour of itself")
    if other_version:
        found = await conn.fetchval(
            """SELECT lifecycle_state FROM tool_versions WHERE tool_id = $1 AND version = $2""",
            other,
            other_version,
        )
    else:
        found = await conn.fetchval(
            """SELECT min(lifecycle_state) FROM tool_versions
               WHERE tool_id = $1 AND lifecycle_state <> 'removed'""",
            other,
        )
    if found is None or found == LifecycleState.REMOVED.value:
        raise InvalidParameters(
            f"successor {successor!r} is not a registered tool version that can run",
            details={"tool_id": tool_id},
        )


def _summary(row: asyncpg.Record, now: datetime) -> dict[str, Any]:
    versions: list[dict[str, Any]] = []
    for v in row["versions"]:
        state = effective_state(
            LifecycleState(v["lifecycle_state"]),
            now,
            deprecation_date=_when(v["deprecation_date"]),
            sunset_date=_when(v["sunset_date"]),
        )
        versions.append(
            {**v, "lifecycle_state": state.value, "deprecated": state is not LifecycleState.ACTIVE}
        )
    latest = next((v for v in versions if not v["deprecated"]), versions[0] if versions else None)
    return {
        "tool_id": row["tool_id"],
        "tool_name": row["name"],
        "description": row["description"],
        "category": row["category"],
        "tags": _tags(row["tags"]),
        "latest_version": latest["version"] if latest else None,
        "requires_approval": bool(latest and latest["requires_approval"]),
        "versions": versions,
    }


def _when(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


async def _restate_pool(conn: PoolConnectionProxy, manifest: ToolManifest) -> None:
    """A re-registered version keeps its contract but takes the pool it is registered
    with now (a deployment setting): its next calls go to that pool's topic."""
    moved = await conn.fetchval(
        """UPDATE tool_versions
           SET pool = $3, manifest = manifest || jsonb_build_object('pool', $3::text)
           WHERE tool_id = $1 AND version = $2 AND pool IS DISTINCT FROM $3
           RETURNING 1""",
        manifest.tool_id,
        manifest.version,
        manifest.pool,
    )
    if moved:
        log.info(
            "tool moved to another pool",
            extra={"tool": f"{manifest.tool_id}@{manifest.version}", "pool": manifest.pool},
        )


async def _restate_keywords(conn: PoolConnectionProxy, manifest: ToolManifest) -> None:
    """A re-registered version takes the search keywords it is registered with now (they
    are not part of its contract); search embeds the tool again when they changed."""
    await conn.execute(
        """UPDATE tool_versions SET manifest = manifest || $3::jsonb
           WHERE tool_id = $1 AND version = $2
             AND manifest -> 'keywords' IS DISTINCT FROM $3::jsonb -> 'keywords'""",
        manifest.tool_id,
        manifest.version,
        {"keywords": manifest.keywords},
    )


def _tags(column: list[str | None] | None) -> list[str]:
    return [t for t in unescape_array(column) or [] if t is not None]


def _manifest(row: asyncpg.Record) -> ToolManifest:
    stored: dict[str, Any] = dict(row["manifest"])
    category = stored.get("category", ToolCategory.GENERAL.value)
    if category not in set(ToolCategory):
        # Registered before categories were a fixed set: still resolvable, the old
        # category kept as a tag.
        stored["category"] = ToolCategory.GENERAL.value
        stored["tags"] = [*stored.get("tags", []), str(category)]
    # The lifecycle lives in its own columns: operators change it without re-registering.
    return ToolManifest.model_validate(
        {
            **stored,
            "lifecycle_state": row["lifecycle_state"],
            "deprecation_message": row["deprecation_message"],
            "deprecation_date": row["deprecation_date"],
            "sunset_date": row["sunset_date"],
            "deprecated_in_favor_of": row["deprecated_in_favor_of"],
        }
    )
