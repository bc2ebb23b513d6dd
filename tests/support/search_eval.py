"""The search evaluation catalog (``tests/data/tool_search_eval.yaml``) as the registry's
ranking reads it: one :class:`ToolDocument` per tool, with its real wordllama vector."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toolfleet.registry.search import ToolDocument, shared_embedder, tool_text


def eval_documents(tools: Sequence[dict[str, Any]], *, keywords: bool) -> list[ToolDocument]:
    """``tools`` (entries of the catalog) as search documents; ``keywords`` False leaves
    out the manifests' keywords (from the words and from the embedded text)."""

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
