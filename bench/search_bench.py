"""How well and how fast tool search finds the tool a plain-language query wants.

    python bench/search_bench.py [--repeat 5] [--catalog-size 1000]

In-process, no database: the registry's ranking (:func:`hybrid_rank`: BM25 over each
tool's words blended with wordllama embeddings) over the 45 tools of
``tests/data/tool_search_eval.yaml``, queried with two sets:
``tests/data/tool_search_queries.json`` (the tuning set: 92 queries written before the
ranking was tuned, and 15 no tool answers; in-sample, the keywords and thresholds were
tuned on it) and ``tests/data/tool_search_heldout.json`` (140 queries over all 45 tools
and 15 no tool answers, written later by someone who saw only the catalog's
descriptions; nothing was tuned on it). For each it prints
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support.search_eval import eval_documents

from toolfleet.registry.search import (
    MIN_SCORE,
    ToolDocument,
    cosines,
    hybrid_rank,
    shared_embedder,
)

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def _embeddings_only(vector: Sequence[float], docs: list[ToolDocument]) -> list[str]:
    """Search as it ranked before the hybrid: cosine alone, nothing under the floor."""
    sims = cosines(vector, [d.embedding or [0.0] * len(vector) for d in docs])
    scored = [(s, d.tool_id) for s, d in zip(sims, docs, strict=True)]
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


def _report(
    title: str,
    queries: list[str],
    wanted: list[str],
    unanswerable: list[str],
    with_keywords: list[ToolDocument],
    without: list[ToolDocument],
) -> None:
    """Recall of the hybrid (with and without keywords) and of embeddings alone, and how
    often the weak flag is on for right and wrong first answers, over one query set."""
    vectors = shared_embedder().embed(queries)
    print(title)
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
    for q, v in zip(unanswerable, shared_embedder().embed(unanswerable), strict=True):
        wrong.append(hybrid_rank(q, v, with_keywords)[0].low_relevance)
    print(
        f"  weak flag: on for {sum(hits)}/{len(hits)} right first answers, "
        f"{sum(wrong)}/{len(wrong)} wrong ones and queries no tool answers"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--catalog-size", type=int, default=1000)
    args = parser.parse_args()

    tools: list[dict[str, Any]] = yaml.safe_load((DATA / "tool_search_eval.yaml").read_text())[
        "tools"
    ]
    with_keywords, without = (
        eval_documents(tools, keywords=True),
        eval_documents(tools, keywords=False),
    )
    sets = [
        ("tuning set, in-sample", "tool_search_queries.json", "misses"),
        ("held-out set", "tool_search_heldout.json", "unanswerable"),
    ]
    queries: list[str] = []
    for title, file, unanswerable_key in sets:
        data = json.loads((DATA / file).read_text())
        queries = [q["q"] for q in data["queries"]]
        _report(
            f"tool search, {title} ({file}): {len(queries)} queries over {len(tools)} tools",
            queries,
            [q["want"] for q in data["queries"]],
            data[unanswerable_key],
            with_keywords,
            without,
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
