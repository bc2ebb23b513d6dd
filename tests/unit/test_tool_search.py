"""Tool search without a database: the relevance floor, the pgvector query path, and
vectors recomputed when a tool's text changed.

This machine's Postgres has no pgvector; the store is driven here through a pool twin
that records the SQL it is sent (the integration test runs that SQL on Postgres against
a stand-in for the extension).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import asyncpg
import pytest

from toolfleet.registry.search import (
    CONFIDENT_SCORE,
    FALLBACK_MATCHES,
    LEXICAL_WEIGHT,
    embedding_tag,
    tool_text,
)
from toolfleet.registry.store import RegistryStore, pgvector_ranking

pytestmark = pytest.mark.unit


class _Embedder:
    model_name = "test/axes"

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return [[1.0, 0.0] for _ in texts]


class _Pool:
    """Answers the registry's queries from fixed rows and records what it was asked."""

    def __init__(
        self, *, vector_schema: str | None, ranked: list[tuple[str, float]], stale: bool = False
    ) -> None:
        self.vector_schema = vector_schema
        self.ranked = ranked
        self.stale = stale
        self.calls: list[tuple[str, tuple[object, ...]]] = []
        self.updated: list[tuple[object, ...]] = []

    async def fetchval(self, sql: str, *args: object) -> object:
        self.calls.append((sql, args))
        assert "pg_extension" in sql
        return self.vector_schema

    async def executemany(self, sql: str, rows: list[tuple[object, ...]]) -> None:
        assert sql.startswith("UPDATE tool_definitions SET embedding")
        self.updated += rows

    async def fetch(self, sql: str, *args: object) -> list[dict[str, Any]]:
        self.calls.append((sql, args))
        if "json_agg" in sql:  # summaries
            return [_summary_row(tool_id) for tool_id in cast("list[str]", args[0])]
        if "OPERATOR(" in sql:
            floor = cast("float", args[-1])
            return [{"tool_id": t, "score": s} for t, s in self.ranked if s >= floor]
        assert "LEFT JOIN LATERAL" in sql  # what search reads of each tool
        # The embedding is (cos, sin) of the wanted similarity against the query (1, 0).
        return [
            {
                "tool_id": t,
                "description": "",
                "category": "general",
                "tags": None,
                "keywords": None,
                "properties": None,
                "embedding": [s, (1 - s * s) ** 0.5],
                "embedding_model": None
                if self.stale
                else embedding_tag(_Embedder.model_name, tool_text(t, "", "general")),
            }
            for t, s in self.ranked
        ]


def _summary_row(tool_id: str) -> dict[str, Any]:
    return {
        "tool_id": tool_id,
        "name": tool_id.split("__", 1)[1],
        "description": "",
        "category": "general",
        "tags": [],
        "versions": [
            {
                "version": "1.0.0",
                "lifecycle_state": "active",
                "effect": "read_only",
                "requires_approval": False,
                "deprecation_date": None,
                "sunset_date": None,
                "deprecated_in_favor_of": None,
            }
        ],
    }


# Cosine similarities; the query shares no word with these tools, so each scores its
# similarity's share of the blend: 0.48, 0.18 (weak) and 0.03 (under the floor).
RANKED = [("acme__strong", 0.8), ("acme__weak", 0.3), ("acme__unrelated", 0.05)]
SIMILARITY_SHARE = 1 - LEXICAL_WEIGHT


def _store(pool: _Pool) -> RegistryStore:
    return RegistryStore(cast("asyncpg.Pool", pool), embedder=_Embedder())


def test_the_pgvector_query_names_the_extensions_schema_and_numbers_its_arguments() -> None:
    sql = pgvector_ranking("d.category = $1 AND $2 = ANY(d.tags)", arg_count=2, schema="ext")
    assert 'd.embedding::"ext".vector OPERATOR("ext".<=>) $3::real[]::"ext".vector' in sql
    assert "WHERE d.category = $1 AND $2 = ANY(d.tags) AND d.embedding IS NOT NULL" in sql
    assert "WHERE score >= $4 ORDER BY score DESC, tool_id" in sql
    odd = pgvector_ranking("true", arg_count=0, schema='we"ird')
    assert '"we""ird".vector' in odd  # a schema name cannot break out of its quotes


async def test_with_pgvector_the_store_ranks_in_the_database() -> None:
    pool = _Pool(vector_schema="public", ranked=RANKED)
    store = _store(pool)
    items, total = await store.list_tools(q="do it", category="general", limit=10)
    assert [(t["tool_id"], t["low_relevance"]) for t in items] == [
        ("acme__strong", False),
        ("acme__weak", True),
    ]
    assert [t["score"] for t in items] == pytest.approx(
        [0.8 * SIMILARITY_SHARE, 0.3 * SIMILARITY_SHARE], abs=1e-4
    )
    assert total == 2
    sql, args = next(c for c in pool.calls if "OPERATOR(" in c[0])
    assert sql == pgvector_ranking(
        "EXISTS (SELECT 1 FROM tool_versions v WHERE v.tool_id = d.tool_id "
        "AND v.lifecycle_state <> 'removed') AND d.category = $1",
        arg_count=1,
        schema="public",
    )
    assert args == ("general", [1.0, 0.0], -2.0)  # every tool: the floor is on the blend


async def test_without_pgvector_the_store_ranks_in_process_alike() -> None:
    pool = _Pool(vector_schema=None, ranked=RANKED)
    items, total = await _store(pool).list_tools(q="do it", limit=10)
    assert [(t["tool_id"], t["low_relevance"]) for t in items] == [
        ("acme__strong", False),
        ("acme__weak", True),
    ]
    assert [t["score"] for t in items] == pytest.approx(
        [0.8 * SIMILARITY_SHARE, 0.3 * SIMILARITY_SHARE], abs=1e-4
    )
    assert total == 2
    assert not any("OPERATOR(" in sql for sql, _ in pool.calls)
    assert pool.updated == []  # every vector is of the tool's current text


async def test_the_extension_is_looked_up_once() -> None:
    pool = _Pool(vector_schema="extensions", ranked=RANKED)
    store = _store(pool)
    assert await store.detect_pgvector() == "extensions"
    await store.list_tools(q="a", limit=1)
    await store.list_tools(q="b", limit=1)
    assert sum("pg_extension" in sql for sql, _ in pool.calls) == 1


async def test_min_score_widens_or_narrows_what_matches() -> None:
    pool = _Pool(vector_schema="public", ranked=RANKED)
    everything, total = await _store(pool).list_tools(q="x", min_score=-1, limit=10)
    assert total == 3
    assert everything[-1]["tool_id"] == "acme__unrelated"
    _, confident = await _store(pool).list_tools(q="x", min_score=CONFIDENT_SCORE, limit=10)
    assert confident == 1


async def test_when_nothing_clears_the_floor_the_best_few_come_back_marked_weak() -> None:
    ranked = [(f"acme__t{i}", 0.1 - i / 100) for i in range(5)]
    pool = _Pool(vector_schema=None, ranked=ranked)
    items, total = await _store(pool).list_tools(q="do it", limit=10)
    assert [t["tool_id"] for t in items] == [t for t, _ in ranked[:FALLBACK_MATCHES]]
    assert total == FALLBACK_MATCHES
    assert all(t["low_relevance"] and t["score"] < CONFIDENT_SCORE for t in items)


async def test_tools_whose_text_changed_are_embedded_again_before_ranking() -> None:
    pool = _Pool(vector_schema="public", ranked=RANKED, stale=True)
    await _store(pool).list_tools(q="do it", limit=10)
    assert [row[0] for row in pool.updated] == [t for t, _ in RANKED]
    assert {row[2] for row in pool.updated} == {
        embedding_tag(_Embedder.model_name, tool_text(t, "", "general")) for t, _ in RANKED
    }
