"""Hybrid tool search through ``GET /v1/tools?q=``, held to fixed evaluation sets.

``tests/data/tool_search_eval.yaml`` holds 45 tools (with their manifest ``keywords``),
45 plain-language queries and 12 nonsense ones; a query counts as found when a tool it
wants ranks in the top three (recall@3). ``tests/data/tool_search_queries.json`` is the
held-out set (92 queries written before the ranking was tuned): through the API it must
reach recall@3 ≥ 0.95 and recall@1 ≥ 0.8, as in ``tests/unit/test_search_ranking.py``.
Results are printed (``-s``) and recorded as test properties. The same searches run once
more through the pgvector query, against a stand-in for the extension (this machine has
no pgvector package).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml
from fastapi import FastAPI

from tests.support.api import running_app
from toolfleet.api import ApiSettings
from toolfleet.api.resources import ApiResources
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.contract.manifest import ToolManifest
from toolfleet.events.models import Effect
from toolfleet.policy.documents import TenantPolicy
from toolfleet.policy.postgres_policies import PolicyStore
from toolfleet.registry.search import FALLBACK_MATCHES, MIN_SCORE
from toolfleet.registry.store import RegistryStore

pytestmark = pytest.mark.integration

DATA = Path(__file__).parents[1] / "data"
EVAL = yaml.safe_load((DATA / "tool_search_eval.yaml").read_text())
HELD_OUT = json.loads((DATA / "tool_search_queries.json").read_text())
RECALL_FLOOR = 0.8


@pytest.fixture(scope="module")
async def app(api_settings: ApiSettings) -> AsyncIterator[FastAPI]:
    async with running_app(api_settings) as application:
        res: ApiResources = application.state.resources
        store = RegistryStore(res.pool)
        for spec in EVAL["tools"]:
            await store.register(_manifest(spec))
        # Another tenant's tool that every nonsense query finds: the caller's answer must
        # still be its own best few (search ranks only what the caller may see).
        nonsense = " ".join(EVAL["nonsense"])
        await store.register(
            _manifest(
                {
                    "id": "other__nonsense",
                    "description": nonsense,
                    "category": "general",
                    "tags": [],
                    "keywords": nonsense.split(),
                }
            )
        )
        await PolicyStore(res.pool).put(
            "search_tenant",
            TenantPolicy(allow_tools=["eval__*"], deny_tools=["eval__sentiment"]),
            "test",
        )
        yield application


@pytest.fixture
def headers(issuer: TokenIssuer) -> dict[str, str]:
    token = issuer.issue(tenant_id="search_tenant", agent_did="did:agent:s")
    return {"Authorization": f"Bearer {token}"}


def _manifest(spec: dict[str, Any]) -> ToolManifest:
    return ToolManifest(
        tool_id=spec["id"],
        version="1.0.0",
        effect=Effect.READ_ONLY,
        description=spec["description"],
        category=spec["category"],
        tags=spec["tags"],
        keywords=spec.get("keywords", []),
        input_schema={"type": "object"},
        output_schema={"type": "object"},
        redaction_allowlist=[],
        timeout_seconds=5,
    )


async def _top(http: httpx.AsyncClient, headers: dict[str, str], q: str, n: int = 3) -> list[str]:
    response = await http.get("/v1/tools", params={"q": q, "page_size": n}, headers=headers)
    assert response.status_code == 200, response.text
    return [t["tool_id"] for t in response.json()["items"]]


async def test_recall_at_3_on_the_evaluation_set(
    http: httpx.AsyncClient,
    headers: dict[str, str],
    record_property: Callable[[str, object], None],
) -> None:
    assert len(EVAL["tools"]) >= 40
    assert len(EVAL["queries"]) >= 30
    queries = [q for q in EVAL["queries"] if "eval__sentiment" not in q["want"]]
    misses: list[tuple[str, list[str]]] = []
    for query in queries:
        top = await _top(http, headers, query["q"])
        if not set(query["want"]) & set(top):
            misses.append((query["q"], top))
    recall = 1 - len(misses) / len(queries)
    record_property("recall_at_3", round(recall, 3))
    print(f"\ntool search recall@3 = {recall:.3f} over {len(queries)} queries; misses: {misses}")
    assert recall >= RECALL_FLOOR, misses


async def test_the_held_out_set_meets_the_goals_through_the_api(
    http: httpx.AsyncClient,
    headers: dict[str, str],
    record_property: Callable[[str, object], None],
) -> None:
    queries = [q for q in HELD_OUT["queries"] if q["want"] != "eval__sentiment"]  # denied
    top1 = top3 = 0
    for query in queries:
        top = await _top(http, headers, query["q"])
        top1 += top[:1] == [query["want"]]
        top3 += query["want"] in top
    recall_1, recall_3 = top1 / len(queries), top3 / len(queries)
    record_property("held_out_recall_at_1", round(recall_1, 3))
    record_property("held_out_recall_at_3", round(recall_3, 3))
    print(f"\nheld-out recall@1 = {recall_1:.3f}, recall@3 = {recall_3:.3f}")
    assert recall_3 >= 0.95
    assert recall_1 >= 0.8


async def test_a_query_nothing_answers_gets_the_best_few_marked_weak(
    http: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    assert len(EVAL["nonsense"]) >= 5
    only_weak = 0
    for q in EVAL["nonsense"]:
        response = await http.get("/v1/tools", params={"q": q}, headers=headers)
        body = response.json()
        assert body["total"] == len(body["items"]), q
        assert body["items"], q  # never a silent empty list
        weak = all(item["low_relevance"] for item in body["items"])
        if body["total"] == FALLBACK_MATCHES and weak:
            assert all(item["score"] < MIN_SCORE for item in body["items"]), q
        only_weak += weak
    assert only_weak >= len(EVAL["nonsense"]) - 2


async def test_results_carry_their_score_best_first(
    http: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    items = (
        await http.get("/v1/tools", params={"q": "zip up these files"}, headers=headers)
    ).json()["items"]
    scores = [t["score"] for t in items]
    assert items[0]["tool_id"] == "eval__compress_archive"
    assert not items[0]["low_relevance"]
    assert scores == sorted(scores, reverse=True)
    assert all(s >= MIN_SCORE for s in scores)
    listed = (await http.get("/v1/tools", headers=headers)).json()["items"]
    assert all(t["score"] is None and not t["low_relevance"] for t in listed)  # no q, no score


async def test_a_query_ranks_within_the_category_and_tag_asked_for(
    http: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    q = "send a message to someone"
    everywhere = await _top(http, headers, q, 10)
    in_category = (
        await http.get("/v1/tools", params={"q": q, "category": "communication"}, headers=headers)
    ).json()
    assert {t["category"] for t in in_category["items"]} == {"communication"}
    assert in_category["total"] == len(in_category["items"]) > 1
    assert [t["tool_id"] for t in in_category["items"]] == [
        t for t in everywhere if t in {i["tool_id"] for i in in_category["items"]}
    ]
    tagged = (
        await http.get("/v1/tools", params={"q": "calendar", "tag": "calendar"}, headers=headers)
    ).json()
    assert {t["tool_id"] for t in tagged["items"]} == {
        "eval__create_calendar_event",
        "eval__list_calendar_events",
    }
    elsewhere = (
        await http.get("/v1/tools", params={"q": q, "category": "media"}, headers=headers)
    ).json()
    # No media tool sends messages: weak matches at best.
    assert elsewhere["items"], "text to speech and transcription share words with messages"
    assert all(t["category"] == "media" and t["low_relevance"] for t in elsewhere["items"])


async def test_search_ranks_only_the_tenants_allowed_tools(
    http: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    found = (
        await http.get(
            "/v1/tools",
            params={"q": "is this review positive", "page_size": 200, "min_score": -1},
            headers=headers,
        )
    ).json()
    ids = [t["tool_id"] for t in found["items"]]
    assert "eval__sentiment" not in ids  # denied by the tenant's policy
    assert all(i.startswith("eval__") for i in ids)
    assert found["total"] == len(EVAL["tools"]) - 1


async def test_tools_registered_before_search_existed_are_embedded_on_first_search(
    http: httpx.AsyncClient, headers: dict[str, str], app: FastAPI
) -> None:
    pool: asyncpg.Pool = app.state.resources.pool
    await pool.execute(
        "UPDATE tool_definitions SET embedding = NULL, embedding_model = NULL "
        "WHERE tool_id = 'eval__generate_password'"
    )
    assert (await _top(http, headers, "make me a strong random password", 1)) == [
        "eval__generate_password"
    ]
    assert await pool.fetchval(
        "SELECT embedding_model FROM tool_definitions WHERE tool_id = 'eval__generate_password'"
    )


# pgvector's type and cosine-distance operator, rebuilt in SQL in a schema of their own:
# the pgvector query runs on this server as it would with the extension.
STANDIN = "vector_standin"
STANDIN_SQL = """
DROP SCHEMA IF EXISTS vector_standin CASCADE;
CREATE SCHEMA vector_standin;
CREATE DOMAIN vector_standin.vector AS real[];
CREATE FUNCTION vector_standin.cosine_distance(a vector_standin.vector, b vector_standin.vector)
    RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    SELECT 1 - sum(x * y) / (sqrt(sum(x * x)) * sqrt(sum(y * y)))
    FROM unnest(a::real[], b::real[]) AS t(x, y) $$;
CREATE OPERATOR vector_standin.<=> (LEFTARG = vector_standin.vector,
    RIGHTARG = vector_standin.vector, FUNCTION = vector_standin.cosine_distance);
"""


class _StandInPgvector(RegistryStore):
    async def detect_pgvector(self) -> str | None:
        return STANDIN


async def test_the_pgvector_query_ranks_as_the_in_process_ranking_does(app: FastAPI) -> None:
    pool: asyncpg.Pool = app.state.resources.pool
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(STANDIN_SQL)
    in_process, pgvector = RegistryStore(pool), _StandInPgvector(pool)
    for q in [query["q"] for query in EVAL["queries"][:15]] + EVAL["nonsense"][:5]:
        filter_sets: list[dict[str, Any]] = [{}, {"category": "finance"}, {"tag": "filesystem"}]
        for filters in filter_sets:
            want, want_total = await in_process.list_tools(q=q, limit=5, **filters)
            got, got_total = await pgvector.list_tools(q=q, limit=5, **filters)
            assert got_total == want_total, (q, filters)
            assert [t["tool_id"] for t in got] == [t["tool_id"] for t in want], (q, filters)
            for g, w in zip(got, want, strict=True):
                assert g["score"] == pytest.approx(w["score"], abs=1e-3)
                assert g["low_relevance"] == w["low_relevance"]


async def test_pgvector_is_detected_where_the_migration_could_create_it(app: FastAPI) -> None:
    pool: asyncpg.Pool = app.state.resources.pool
    installable = await pool.fetchval(
        "SELECT count(*) FROM pg_available_extensions WHERE name = 'vector'"
    )
    schema = await RegistryStore(pool).detect_pgvector()
    assert (schema is not None) == bool(installable)


async def test_re_registering_a_version_with_new_keywords_makes_search_find_it(
    app: FastAPI,
) -> None:
    pool: asyncpg.Pool = app.state.resources.pool
    store = RegistryStore(pool)
    # Outside ``eval__``: the search tenant never sees it, so the other tests' counts hold.
    spec = {
        "id": "kwprobe__one_thing",
        "category": "general",
        "tags": [],
        "description": "Does one thing.",
    }
    q = "zorbulate the quux"
    await store.register(_manifest(spec))
    before, _ = await store.list_tools(q=q, limit=3)
    assert all(t["tool_id"] != "kwprobe__one_thing" or t["low_relevance"] for t in before), before
    assert not await store.register(_manifest({**spec, "keywords": ["zorbulate", "quux"]}))
    after, _ = await store.list_tools(q=q, limit=3)
    assert after[0]["tool_id"] == "kwprobe__one_thing"
    assert not after[0]["low_relevance"]
    (manifest,) = await store.versions("kwprobe__one_thing")
    assert manifest.keywords == ["zorbulate", "quux"]
    assert manifest.schema_hash == _manifest(spec).schema_hash
