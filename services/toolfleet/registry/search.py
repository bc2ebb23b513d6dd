"""Semantic tool search: embeddings of what a tool does, ranked by cosine similarity.

Pure logic plus one adapter. :class:`TextEmbedder` is the port; :class:`WordLlamaEmbedder`
implements it with ``wordllama``, whose wheel carries its weights and tokenizer, so
nothing is downloaded at run time (the files are opened from the installed package,
never through wordllama's loader, which looks for the tokenizer in the wrong folder and
then goes to the network). The store keeps one vector per tool in Postgres and ranks
with pgvector when the server has it, else with :func:`rank` here.

Scores are cosine similarities. ``wordllama``'s similarities of unrelated texts stay low
but not near zero, so two thresholds, calibrated on ``tests/data/tool_search_eval.yaml``:
a tool under :data:`MIN_SCORE` is not a match at all, and one under
:data:`CONFIDENT_SCORE` is returned marked as a weak match. There, every wanted tool in
a top three scores ≥ 0.19 but two (0.07, 0.08: lost, recall@3 0.93 → 0.89), and no tool
scores 0.25 or more for any of twelve nonsense queries (highest 0.24; four of them
return nothing).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Any, Protocol

MIN_SCORE = 0.15
"""Tools scoring under this do not match the query and are left out."""
CONFIDENT_SCORE = 0.25
"""Tools scoring under this are returned marked ``low_relevance``."""


@dataclass(frozen=True, slots=True)
class Match:
    """One tool as a query ranks it."""

    tool_id: str
    score: float
    """Cosine similarity of the tool's text to the query (1: same meaning)."""

    @property
    def low_relevance(self) -> bool:
        return self.score < CONFIDENT_SCORE


class TextEmbedder(Protocol):
    """Turns texts into unit vectors of one fixed dimension."""

    @property
    def model_name(self) -> str:
        """Stored beside each vector: vectors of another model are recomputed."""
        ...

    def embed(self, texts: Sequence[str]) -> list[list[float]]: ...


class WordLlamaEmbedder:
    """``wordllama``'s ``l2_supercat`` model (256 dimensions), loaded on first use."""

    model_name = "wordllama/l2_supercat_256"

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                from safetensors import safe_open
                from tokenizers import Tokenizer
                from wordllama.inference import WordLlamaInference

                root = files("wordllama")
                tokenizer = Tokenizer.from_file(
                    str(root / "tokenizers" / "l2_supercat_tokenizer_config.json")
                )
                weights = str(root / "weights" / "l2_supercat_256.safetensors")
                with safe_open(weights, framework="np", device="cpu") as f:
                    table = f.get_tensor("embedding.weight")
                self._model = WordLlamaInference(table, tokenizer, binary=False)
            return self._model

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        vectors = self._load().embed(list(texts), norm=True)
        return [[float(x) for x in row] for row in vectors]


_shared: WordLlamaEmbedder | None = None
_shared_lock = threading.Lock()


def shared_embedder() -> WordLlamaEmbedder:
    """One embedder per process: its table is 16 MB, and it holds no connection."""
    global _shared  # a read-only model, loaded once per process
    with _shared_lock:
        if _shared is None:
            _shared = WordLlamaEmbedder()
        return _shared


def tool_text(tool_id: str, description: str, category: str, tags: Iterable[str] = ()) -> str:
    """What is embedded for a tool: its name in words, description, category and tags."""
    namespace, _, name = tool_id.partition("__")
    words = re.sub(r"[_\-]+", " ", name).strip()
    parts = [words, description.strip(), f"category {category}", " ".join(tags), namespace]
    return ". ".join(p for p in parts if p)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norms = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norms if norms else 0.0


def rank(
    query: Sequence[float],
    candidates: Iterable[tuple[str, Sequence[float]]],
    *,
    min_score: float = MIN_SCORE,
) -> list[Match]:
    """Candidates scoring at least ``min_score``, most similar to ``query`` first (ties by
    id, for stable pages)."""
    scored = [Match(key, cosine(query, vector)) for key, vector in candidates]
    return sorted((m for m in scored if m.score >= min_score), key=lambda m: (-m.score, m.tool_id))
