"""Tool search: lexical (BM25) and semantic (embeddings) ranking, blended into one score.

Pure logic plus one adapter. :class:`TextEmbedder` is the port; :class:`WordLlamaEmbedder`
implements it with ``wordllama``, whose wheel carries its weights and tokenizer, so
nothing is downloaded at run time (the files are opened from the installed package,
never through wordllama's loader, which looks for the tokenizer in the wrong folder and
then goes to the network). The store keeps one vector per tool in Postgres and computes
cosine similarities with pgvector when the server has it, else with :func:`cosine` here.

Embeddings alone miss short and slangy queries ("text my driver" is not near "send a
short text message to a mobile phone number" for a 256-dimension word model), and
words alone miss paraphrases. :func:`hybrid_rank` blends both: BM25 over a tool's name
split into words, its description, category, tags, parameter names and descriptions,
and the ``keywords`` its manifest lists (synonyms and slang the author expects, also
embedded), with the name and keywords counted :data:`_HEAVY` times. The BM25 score is
squashed into ``[0, 1)`` so the blend is a score with a fixed meaning whatever the
catalog. The words pay off through the keywords: without them the blend ranks no better
than the embeddings do.

The thresholds were chosen on ``tests/data/tool_search_queries.json`` (the tuning set)
and checked on ``tests/data/tool_search_heldout.json`` (held out; numbers in
``docs/registry.md``): a tool under :data:`MIN_SCORE` is not a match, and one under
:data:`CONFIDENT_SCORE`, or under :data:`CLEAR_SCORE` and close to another tool's score,
is a weak one. A query nothing clears the
floor for still gets its best :data:`FALLBACK_MATCHES`, all marked weak: "no confident
match" is an answer the caller can show, where an empty list reads as "no such tool".
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib.resources import files
from typing import Any, Protocol

MIN_SCORE = 0.15
"""Tools scoring under this do not match the query and are left out (but see
:data:`FALLBACK_MATCHES`)."""
CONFIDENT_SCORE = 0.2
"""Tools scoring under this are returned marked ``low_relevance``."""
CLEAR_SCORE = 0.4
"""Tools scoring under this are also marked weak when another tool scores within
:data:`AMBIGUOUS_MARGIN` of them: a middling score barely ahead of (or behind) another
tool is a guess between the two, not an answer."""
AMBIGUOUS_MARGIN = 0.04
FALLBACK_MATCHES = 3
"""When no tool reaches the floor, this many best tools are returned, all marked weak."""
LEXICAL_WEIGHT = 0.4
"""Share of the lexical score in the blend (the rest is cosine similarity)."""
_LEXICAL_HALF = 8.0
"""BM25 score that the squash maps to 0.5 (one rare word of a tool's name scores ~5)."""
_HEAVY = 3
"""How many times a tool's name words and keywords count against its description's."""
_K1, _B = 1.2, 0.75


@dataclass(frozen=True, slots=True)
class Match:
    """One tool as a query ranks it."""

    tool_id: str
    score: float
    """Blend of cosine similarity and lexical match, in ``[-1, 1]`` (1: same meaning)."""
    low_relevance: bool = False
    """A weak match: under :data:`CONFIDENT_SCORE`, or under :data:`CLEAR_SCORE` with
    another tool within :data:`AMBIGUOUS_MARGIN` of it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolDocument:
    """What search reads of a tool: its words, and its embedding."""

    tool_id: str
    description: str = ""
    category: str = ""
    tags: tuple[str, ...] = ()
    keywords: tuple[str, ...] = ()
    """The manifest's ``keywords``: synonyms and slang a user may search for."""
    parameters: tuple[tuple[str, str], ...] = ()
    """Input parameter names and descriptions of the newest version."""
    embedding: Sequence[float] | None = None


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


def tool_text(
    tool_id: str,
    description: str,
    category: str,
    tags: Iterable[str] = (),
    keywords: Iterable[str] = (),
) -> str:
    """What is embedded for a tool: its name in words, description, category, tags and
    keywords."""
    namespace, _, name = tool_id.partition("__")
    words = re.sub(r"[_\-]+", " ", name).strip()
    parts = [
        words,
        description.strip(),
        f"category {category}",
        " ".join(tags),
        namespace,
        ", ".join(keywords),
    ]
    return ". ".join(p for p in parts if p)


def embedding_tag(model_name: str, text: str) -> str:
    """Stored beside a tool's vector: the model and a digest of the text it embedded, so
    a vector is recomputed when either changes (a new manifest's keywords included)."""
    return f"{model_name}#{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def parameters_of(input_schema: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    """Top-level parameter names and descriptions of an input JSON Schema."""
    properties = (input_schema or {}).get("properties")
    if not isinstance(properties, Mapping):
        return ()
    return tuple(
        (str(name), str(spec.get("description", "")) if isinstance(spec, Mapping) else "")
        for name, spec in properties.items()
    )


# Words that say nothing about which tool is wanted; kept short so that "send" or "list"
# still count.
_STOPWORDS = frozenset(
    {
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "could",
        "do",
        "does",
        "doing",
        "for",
        "from",
        "get",
        "give",
        "go",
        "gonna",
        "how",
        "hows",
        "im",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "me",
        "my",
        "of",
        "on",
        "or",
        "our",
        "please",
        "some",
        "that",
        "the",
        "their",
        "them",
        "there",
        "these",
        "this",
        "those",
        "to",
        "us",
        "want",
        "we",
        "what",
        "whats",
        "which",
        "who",
        "will",
        "with",
        "would",
        "you",
        "your",
    }
)
_WORD = re.compile(r"[a-z0-9]+")  # after apostrophes are dropped: "what's" is "whats"


def _stem(word: str) -> str:
    """A light suffix stripper: enough for "files"/"file", "meetings"/"meeting"."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 5 and word.endswith("ing"):
        return word[:-3]
    if len(word) > 4 and word.endswith("ed"):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def terms(text: str) -> list[str]:
    """Lexical terms of ``text``: lower-cased words, split on ``_``, stemmed, no stopwords."""
    words = _WORD.findall(text.lower().replace("'", "").replace("_", " "))
    return [_stem(w) for w in words if len(w) > 1 and w not in _STOPWORDS]


def _document_terms(doc: ToolDocument) -> tuple[Mapping[str, int], int]:
    """``doc``'s term counts and length (remembered: a catalog's words change rarely,
    and tokenizing every tool again was a third of a query's time over 1,000 tools)."""
    return _term_bag(doc.tool_id, doc.description, doc.category, doc.tags, doc.keywords,
                     doc.parameters)  # fmt: skip


@lru_cache(maxsize=16_384)
def _term_bag(
    tool_id: str,
    description: str,
    category: str,
    tags: tuple[str, ...],
    keywords: tuple[str, ...],
    parameters: tuple[tuple[str, str], ...],
) -> tuple[Mapping[str, int], int]:
    _, _, name = tool_id.partition("__")
    heavy = terms(name) + terms(" ".join(keywords))
    light = terms(description) + terms(category) + terms(" ".join(tags))
    for param, about in parameters:
        light += terms(param) + terms(about)
    words = heavy * _HEAVY + light
    return Counter(words), len(words)


def bm25_scores(query: str, docs: Sequence[ToolDocument]) -> list[float]:
    """Okapi BM25 of ``query`` against each of ``docs``, the corpus being ``docs``."""
    wanted = set(terms(query))
    if not docs or not wanted:
        return [0.0] * len(docs)
    bags = [_document_terms(d) for d in docs]
    average = sum(length for _, length in bags) / len(bags) or 1.0
    n = len(bags)
    idf = {}
    for t in wanted:
        df = sum(1 for bag, _ in bags if t in bag)
        idf[t] = math.log(1 + (n - df + 0.5) / (df + 0.5))
    scores = []
    for bag, length in bags:
        score = 0.0
        for t in wanted:
            tf = bag.get(t, 0)
            if tf:
                score += idf[t] * tf * (_K1 + 1) / (tf + _K1 * (1 - _B + _B * length / average))
        scores.append(score)
    return scores


def cosines(query: Sequence[float], vectors: Sequence[Sequence[float]]) -> list[float]:
    """Cosine similarity of ``query`` with each of ``vectors`` (one matrix product: over
    1,000 tools the pure-Python loop took two thirds of a query's time)."""
    if not vectors:
        return []
    import numpy as np  # only where search runs: workers that never search don't load it

    matrix = np.asarray(vectors, dtype=np.float64)
    q = np.asarray(query, dtype=np.float64)
    norms = np.linalg.norm(matrix, axis=1) * float(np.linalg.norm(q))
    dots = matrix @ q
    safe = np.where(norms > 0, norms, 1.0)
    return [float(x) for x in np.where(norms > 0, dots / safe, 0.0)]


def blend(similarity: float, lexical: float) -> float:
    """One score from a cosine similarity and a BM25 score (squashed into ``[0, 1)``)."""
    squashed = lexical / (lexical + _LEXICAL_HALF)
    return (1 - LEXICAL_WEIGHT) * similarity + LEXICAL_WEIGHT * squashed


def hybrid_rank(
    query: str,
    query_vector: Sequence[float],
    docs: Sequence[ToolDocument],
    *,
    similarities: Mapping[str, float] | None = None,
    min_score: float = MIN_SCORE,
) -> list[Match]:
    """``docs`` scoring at least ``min_score``, best first (ties by id, for stable pages);
    if none does, the best :data:`FALLBACK_MATCHES`, every one under
    :data:`CONFIDENT_SCORE` (marked weak).

    ``similarities`` (tool id to cosine similarity, from pgvector) stands in for the
    documents' own embeddings; a tool with neither is ranked by its words alone.
    """
    lexical = bm25_scores(query, docs)
    if similarities is None:
        embedded = [d for d in docs if d.embedding]
        vectors = [d.embedding for d in embedded if d.embedding]
        similarities = dict(
            zip((d.tool_id for d in embedded), cosines(query_vector, vectors), strict=True)
        )
    ranked = sorted(
        (
            (blend(similarities.get(doc.tool_id, 0.0), lex), doc.tool_id)
            for doc, lex in zip(docs, lexical, strict=True)
        ),
        key=lambda pair: (-pair[0], pair[1]),
    )
    scored = [
        Match(tool_id, score, _weak(score, ranked, i)) for i, (score, tool_id) in enumerate(ranked)
    ]
    kept = [m for m in scored if m.score >= min_score]
    return kept or scored[:FALLBACK_MATCHES]


def _weak(score: float, ranked: Sequence[tuple[float, str]], at: int) -> bool:
    """Whether the ``at``-th of ``ranked`` (scores, best first) is a weak match."""
    if score < CONFIDENT_SCORE:
        return True
    if score >= CLEAR_SCORE:
        return False
    neighbours = [ranked[j][0] for j in (at - 1, at + 1) if 0 <= j < len(ranked)]
    return any(abs(score - other) < AMBIGUOUS_MARGIN for other in neighbours)
