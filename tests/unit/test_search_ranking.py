"""Hybrid tool search held to two query sets, and the pieces it is made of.

``tests/data/tool_search_queries.json`` (the tuning set: 92 queries and 15 no tool
answers) was written before the ranking was tuned, then the weights, thresholds and the
catalog's keywords were tuned on it: its recall is in-sample.
``tests/data/tool_search_heldout.json`` (140 queries over all 45 tools, 15 no tool
answers) was written afterwards by someone who saw only the catalog's ids, categories,
tags and descriptions, and nothing was tuned on it: the goals (recall@3 >= 0.95,
recall@1 >= 0.8) are held to it. Ranking runs here as the registry runs it
(:func:`hybrid_rank` over the real wordllama vectors and each tool's words), without a
database; ``tests/integration/test_tool_search.py`` runs the tuning set through
``GET /v1/tools?q=``. The model is deterministic, so are the numbers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.search_eval import eval_documents
from toolfleet.contract.manifest import ToolManifest
from toolfleet.registry.search import (
    CONFIDENT_SCORE,
    FALLBACK_MATCHES,
    MIN_SCORE,
    ToolDocument,
    bm25_scores,
    embedding_tag,
    hybrid_rank,
    parameters_of,
    shared_embedder,
    terms,
    tool_text,
)

pytestmark = pytest.mark.unit

DATA = Path(__file__).parents[1] / "data"
TUNING: dict[str, Any] = json.loads((DATA / "tool_search_queries.json").read_text())
HELD_OUT: dict[str, Any] = json.loads((DATA / "tool_search_heldout.json").read_text())
SETS = {
    "tuning": (TUNING["queries"], TUNING["misses"]),
    "held-out": (HELD_OUT["queries"], HELD_OUT["unanswerable"]),
}
CATALOG: list[dict[str, Any]] = yaml.safe_load((DATA / "tool_search_eval.yaml").read_text())[
    "tools"
]
RECALL_AT_3_GOAL = 0.95
RECALL_AT_1_GOAL = 0.8


@cache
def _documents(*, with_keywords: bool = True) -> tuple[ToolDocument, ...]:
    return tuple(eval_documents(CATALOG, keywords=with_keywords))


def _search(q: str, docs: tuple[ToolDocument, ...]) -> list[tuple[str, float, bool]]:
    (vector,) = shared_embedder().embed([q])
    return [(m.tool_id, m.score, m.low_relevance) for m in hybrid_rank(q, vector, docs)]


@pytest.mark.parametrize("name", SETS)
def test_each_query_set_is_what_its_header_says(name: str) -> None:
    queries, unanswerable = SETS[name]
    assert len(queries) >= 60
    assert len({q["q"] for q in queries}) == len(queries)
    assert {q["want"] for q in queries} <= {t["id"] for t in CATALOG}
    assert len(unanswerable) >= 10


def test_the_held_out_set_was_written_after_the_tuning_set_and_covers_the_catalog() -> None:
    assert HELD_OUT["written_at"] > TUNING["written_at"]
    assert {q["want"] for q in HELD_OUT["queries"]} == {t["id"] for t in CATALOG}


@pytest.mark.parametrize("name", SETS)
def test_recall_meets_the_goals(name: str, record_property: Callable[[str, object], None]) -> None:
    queries, _ = SETS[name]
    top1 = top3 = 0
    misses = []
    for query in queries:
        ranked = [tool_id for tool_id, _, _ in _search(query["q"], _documents())]
        top1 += ranked[:1] == [query["want"]]
        top3 += query["want"] in ranked[:3]
        if query["want"] not in ranked[:3]:
            misses.append((query["q"], ranked[:3]))
    recall_1, recall_3 = top1 / len(queries), top3 / len(queries)
    record_property("recall_at_1", round(recall_1, 3))
    record_property("recall_at_3", round(recall_3, 3))
    print(f"\n{name} set: recall@1 {recall_1:.3f} recall@3 {recall_3:.3f}; misses: {misses}")
    assert recall_3 >= RECALL_AT_3_GOAL, misses
    assert recall_1 >= RECALL_AT_1_GOAL


# Share of wrong first answers and unanswerable queries flagged weak, at least: in-sample
# 0.78 (thresholds chosen on the tuning set: the rule flagging most of its misses with at
# most 5% of its hits), out of sample 0.40 (before the ambiguity rule: 0.65 and 0.27).
_MISSES_FLAGGED = {"tuning": 0.75, "held-out": 0.35}


@pytest.mark.parametrize("name", SETS)
def test_the_weak_flag_tells_a_hit_from_a_miss(name: str) -> None:
    """A right first answer is rarely flagged; a wrong one, or one for a query no tool
    answers, is far more often (the issue's search flagged 12 of 26 hits)."""
    queries, unanswerable = SETS[name]
    hits = hits_weak = misses = misses_weak = 0
    for query in queries:
        tool_id, _, weak = _search(query["q"], _documents())[0]
        if tool_id == query["want"]:
            hits, hits_weak = hits + 1, hits_weak + weak
        else:
            misses, misses_weak = misses + 1, misses_weak + weak
    for q in unanswerable:
        misses, misses_weak = misses + 1, misses_weak + _search(q, _documents())[0][2]
    print(f"\n{name} weak: {hits_weak}/{hits} hits, {misses_weak}/{misses} misses")
    assert hits_weak / hits <= 0.05
    assert misses_weak / misses >= _MISSES_FLAGGED[name]


def test_a_middling_answer_barely_ahead_of_another_is_weak() -> None:
    docs = [ToolDocument(tool_id=t, description="x") for t in ("a", "b", "c")]
    close = hybrid_rank("q", [1.0], docs, similarities={"a": 0.6, "b": 0.57, "c": 0.0})
    assert [(m.tool_id, m.low_relevance) for m in close[:2]] == [("a", True), ("b", True)]
    clear = hybrid_rank("q", [1.0], docs, similarities={"a": 0.6, "b": 0.4, "c": 0.0})
    assert [(m.tool_id, m.low_relevance) for m in clear[:2]] == [("a", False), ("b", False)]
    high = hybrid_rank("q", [1.0], docs, similarities={"a": 0.95, "b": 0.93, "c": 0.0})
    assert not high[0].low_relevance  # a high score is an answer, however close the next


def test_a_query_nothing_answers_gets_the_best_few_all_marked_weak() -> None:
    for q in ("xyzzy plugh", "purple elephant dancing on the moon", "knit a scarf"):
        found = _search(q, _documents())
        assert len(found) == FALLBACK_MATCHES, q
        assert all(weak and score < MIN_SCORE for _, score, weak in found), (q, found)


def test_keywords_find_what_the_description_does_not_say() -> None:
    q = "text my driver I'm running late"
    without = [t for t, _, _ in _search(q, _documents(with_keywords=False))]
    found = _search(q, _documents())
    assert "eval__send_sms" not in without[:1]
    assert found[0][0] == "eval__send_sms"
    assert not found[0][2]


def test_the_lexical_part_reads_names_tags_parameters_and_keywords() -> None:
    docs = [
        ToolDocument(tool_id="acme__send_sms", description="Send a short message."),
        ToolDocument(tool_id="acme__resize", description="Resize.", tags=("images",)),
        ToolDocument(
            tool_id="acme__lookup",
            description="Look something up.",
            parameters=parameters_of(
                {"properties": {"ticker_symbol": {"description": "Stock ticker"}}}
            ),
        ),
        ToolDocument(tool_id="acme__fly", description="Book flights.", keywords=("plane",)),
    ]
    for q, want in [
        ("sms", 0),
        ("image", 1),
        ("ticker", 2),
        ("symbol", 2),
        ("plane", 3),
    ]:
        scores = bm25_scores(q, docs)
        assert max(range(len(docs)), key=scores.__getitem__) == want, q
        assert sorted(scores)[-2] == 0.0, q  # the others share no word with it
    assert bm25_scores("the of what's", docs) == [0.0] * len(docs)  # stopwords only


def test_terms_are_words_without_stopwords_lightly_stemmed() -> None:
    assert terms("What's in my Files_and folders?") == ["file", "folder"]
    assert terms("how's TSLA doing") == ["tsla"]
    assert terms("meetings scheduled") == ["meeting", "schedul"]


def test_ties_rank_by_id_and_similarities_stand_in_for_vectors() -> None:
    docs = [ToolDocument(tool_id=t, description="same words") for t in ("b", "a", "c")]
    ranked = hybrid_rank("same words", [1.0], docs, similarities={"c": 0.9}, min_score=-1)
    assert [m.tool_id for m in ranked] == ["c", "a", "b"]
    assert ranked[0].score > ranked[1].score == ranked[2].score
    assert not ranked[0].low_relevance
    assert ranked[0].score >= CONFIDENT_SCORE


def test_a_vector_is_recomputed_when_the_text_it_embedded_changes() -> None:
    before = tool_text("acme__x", "Does x.", "general", ["t"])
    after = tool_text("acme__x", "Does x.", "general", ["t"], ["synonym"])
    assert "synonym" in after
    assert embedding_tag("m", before) != embedding_tag("m", after)
    assert embedding_tag("m", before) == embedding_tag("m", before)
    assert embedding_tag("m", before) != embedding_tag("other", before)


def test_the_manifest_carries_keywords_and_they_are_not_part_of_the_contract() -> None:
    base: dict[str, Any] = {
        "tool_id": "acme__x",
        "version": "1.0.0",
        "effect": "read_only",
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
        "redaction_allowlist": [],
        "timeout_seconds": 5,
    }
    plain = ToolManifest.model_validate(base)
    worded = ToolManifest.model_validate({**base, "keywords": ["sms", "text"]})
    assert plain.keywords == []
    assert worded.keywords == ["sms", "text"]
    assert plain.schema_hash == worded.schema_hash
