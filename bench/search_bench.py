"""How well and how fast tool search finds the tool a plain-language query wants.

    python bench/search_bench.py [--repeat 5] [--catalog-size 1000]

In-process, no database: the registry's ranking (:func:`hybrid_rank`: BM25 over each
tool's words blended with wordllama embeddings) over the 45 tools of
``tests/data/tool_search_eval.yaml``, queried with
``tests/data/tool_search_queries.json`` (92 queries written before the ranking was
tuned, and 15 no tool answers; in-sample: the keywords were tuned on it). Prints
recall@1 and recall@3 of the hybrid ranking, of
the same without the manifests' ``keywords``, and of embeddings alone as search ranked
before it (cosine, no keywords, nothing under 0.15); how often the weak flag is on for a
right first answer and for a wrong one; and the latency of one query (embedding it and
ranking, best of ``--repeat`` passes, p50 and p95) over the catalog and over a catalog of
``--catalog-size`` tools (the same tools, copied under other ids). The embedder and the
ranking are deterministic, so the recalls are the same on every run; the latencies are
this machine's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "services"))

from toolfleet.registry.search import (
    MIN_SCORE,
    ToolDocument,
    cosine,
    hybrid_rank,
    shared_embedder,
    tool_text,
)

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def _documents(tools: list[dict[str, Any]], *, keywords: bool) -> list[ToolDocument]:
    def words(t: dict[str, Any]) -> tuple[str, ...]:
        return tuple(t.get("keywords", ())) if keywords else ()

    texts = [
        tool_text(t["id"], t["description"], t["category"], t["tags"], words(t)) for t in tools
    ]
    vectors = shared_embedder().embed(texts)
    return [
        ToolDocument(
            tool_id=t["id"],
            description=t["description"],
            category=t["category"],
            tags=tuple(t["tags"]),
            keywords=words(t),
            embedding=v,
        )
        for t, v in zip(tools, vectors, strict=True)
    ]


def _embeddings_only(vector: Sequence[float], docs: list[ToolDocument]) -> list[str]:
    """Search as it ranked before the hybrid: cosine alone, nothing under the floor."""
    scored = [(cosine(vector, d.embedding or ()), d.tool_id) for d in docs]
    return [t for s, t in sorted(scored, key=lambda x: (-x[0], x[1])) if s >= MIN_SCORE]


def _recall(ranked: list[list[str]], wanted: list[str]) -> tuple[float, float]:
    top1 = sum(r[:1] == [w] for r, w in zip(ranked, wanted, strict=True))
    top3 = sum(w in r[:3] for r, w in zip(ranked, wanted, strict=True))
    return top1 / len(wanted), top3 / len(wanted)


def _latency_ms(queries: list[str], docs: list[ToolDocument], repeat: int) -> tuple[float, float]:
    embedder = shared_embedder()
    best: list[float] = [float("inf")] * len(queries)
    for _ in range(repeat):
        for i, q in enumerate(queries):
            start = time.perf_counter()
            (vector,) = embedder.embed([q])
            hybrid_rank(q, vector, docs)
            best[i] = min(best[i], (time.perf_counter() - start) * 1000)
    cuts = statistics.quantiles(best, n=20)
    return statistics.median(best), cuts[18]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--catalog-size", type=int, default=1000)
    args = parser.parse_args()

    tools: list[dict[str, Any]] = yaml.safe_load((DATA / "tool_search_eval.yaml").read_text())[
        "tools"
    ]
    held_out = json.loads((DATA / "tool_search_queries.json").read_text())
    queries = [q["q"] for q in held_out["queries"]]
    wanted = [q["want"] for q in held_out["queries"]]
    vectors = shared_embedder().embed(queries)
    with_keywords, without = _documents(tools, keywords=True), _documents(tools, keywords=False)

    print(f"tool search, query set (in-sample): {len(queries)} queries over {len(tools)} tools")
    rows = [
        (
            "hybrid, manifest keywords",
            [hybrid_rank(q, v, with_keywords) for q, v in zip(queries, vectors, strict=True)],
        ),
        (
            "hybrid, no keywords",
            [hybrid_rank(q, v, without) for q, v in zip(queries, vectors, strict=True)],
        ),
    ]
    for name, matches in rows:
        r1, r3 = _recall([[m.tool_id for m in ms] for ms in matches], wanted)
        print(f"  {name:<28} recall@1 {r1:.3f}  recall@3 {r3:.3f}")
    before = [_embeddings_only(v, without) for v in vectors]
    r1, r3 = _recall(before, wanted)
    print(f"  {'embeddings only (before)':<28} recall@1 {r1:.3f}  recall@3 {r3:.3f}")

    hybrid = rows[0][1]
    hits = [ms[0].low_relevance for ms, w in zip(hybrid, wanted, strict=True) if ms[0].tool_id == w]
    wrong = [
        ms[0].low_relevance for ms, w in zip(hybrid, wanted, strict=True) if ms[0].tool_id != w
    ]
    for q, v in zip(held_out["misses"], shared_embedder().embed(held_out["misses"]), strict=True):
        wrong.append(hybrid_rank(q, v, with_keywords)[0].low_relevance)
    print(
        f"  weak flag: on for {sum(hits)}/{len(hits)} right first answers, "
        f"{sum(wrong)}/{len(wrong)} wrong ones and queries no tool answers"
    )

    big = [
        replace(d, tool_id=f"{d.tool_id}_{i // len(with_keywords)}")
        for i, d in enumerate(with_keywords * (args.catalog_size // len(with_keywords) + 1))
    ][: args.catalog_size]
    for docs in (with_keywords, big):
        p50, p95 = _latency_ms(queries, docs, args.repeat)
        print(f"  latency, {len(docs):>5} tools: p50 {p50:.2f} ms  p95 {p95:.2f} ms per query")


if __name__ == "__main__":
    main()
