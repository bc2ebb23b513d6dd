"""A small document source: an MCP server (the ``mcp`` SDK) over a JSON file.

Run it as ``python -m toolfleet.documents.reference_server DOCUMENTS.json`` (stdio; the
executor starts it when ``TOOLFLEET_DOCUMENT_SOURCE`` is that command), or with
``--http --port N`` for Streamable HTTP at ``/mcp``. The file is::

    {"documents": [{"document_id": "handbook", "title": "Handbook",
                    "versions": [{"version": "1", "content": "..."}, ...]}]}

It is read again on every request, so a version appended to the file is served at once
(publish the id on ``document:updates`` so the fleet's caches drop what they hold).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError


def _load(path: Path) -> dict[str, dict[str, Any]]:
    data = json.loads(path.read_text())
    return {d["document_id"]: d for d in data.get("documents", [])}


def _document(path: Path, document_id: str) -> dict[str, Any]:
    found = _load(path).get(document_id)
    if found is None or not found.get("versions"):
        raise ToolError(f"document_not_found: no document {document_id!r}")
    return found


def _hit(doc: dict[str, Any], score: float = 0.0) -> dict[str, Any]:
    latest = doc["versions"][-1]
    return {
        "document_id": doc["document_id"],
        "version": str(latest["version"]),
        "title": doc.get("title", ""),
        "snippet": str(latest["content"])[:200],
        "score": score,
    }


def build_server(path: Path) -> MCPServer:
    """The four tools of the document bridge, over the file at ``path``."""
    server = MCPServer(name="toolfleet-reference-documents")

    @server.tool()
    def get_source_of_truth(document_id: str, version: str | None = None) -> dict[str, Any]:
        """One version of a document (the latest when ``version`` is omitted)."""
        doc = _document(path, document_id)
        versions = doc["versions"]
        chosen = versions[-1] if version is None else None
        for candidate in versions:
            if str(candidate["version"]) == version:
                chosen = candidate
        if chosen is None:
            raise ToolError(f"document_not_found: no version {version!r} of {document_id!r}")
        return {
            "document_id": document_id,
            "version": str(chosen["version"]),
            "title": doc.get("title", ""),
            "content": chosen["content"],
            "content_type": chosen.get("content_type", "text/plain"),
        }

    @server.tool()
    def get_document_metadata(document_id: str) -> dict[str, Any]:
        """Title, latest version and every version of a document."""
        doc = _document(path, document_id)
        versions = [str(v["version"]) for v in doc["versions"]]
        return {
            "document_id": document_id,
            "title": doc.get("title", ""),
            "latest_version": versions[-1],
            "versions": versions,
            "updated_at": doc["versions"][-1].get("updated_at"),
        }

    @server.tool()
    def search_documents(query: str, limit: int = 10) -> dict[str, Any]:
        """Documents whose title or latest content contains ``query`` (case-insensitive)."""
        needle = query.lower()
        hits = [
            _hit(doc, 1.0)
            for doc in _load(path).values()
            if doc.get("versions")
            and needle in f"{doc.get('title', '')} {doc['versions'][-1]['content']}".lower()
        ]
        return {"results": hits[: max(0, limit)]}

    @server.tool()
    def find_overlaps(document_id: str, limit: int = 10) -> dict[str, Any]:
        """Other documents sharing words with ``document_id``'s latest version."""
        words = set(str(_document(path, document_id)["versions"][-1]["content"]).lower().split())
        hits = []
        for other in _load(path).values():
            if other["document_id"] == document_id or not other.get("versions"):
                continue
            shared = words & set(str(other["versions"][-1]["content"]).lower().split())
            if shared:
                hits.append(_hit(other, float(len(shared))))
        hits.sort(key=lambda h: -float(h["score"]))
        return {"results": hits[: max(0, limit)]}

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("documents", type=Path, help="the JSON file of documents")
    parser.add_argument("--http", action="store_true", help="Streamable HTTP instead of stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    server = build_server(args.documents)
    if args.http:
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
