"""The document source port, and its in-memory twin for tests.

Adapters: :class:`~toolfleet.documents.mcp_source.McpDocumentSource` (an MCP server);
:class:`MemoryDocumentSource` (dicts). Both raise the ``document_*`` errors of
:mod:`toolfleet.errors`, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from toolfleet.errors import DocumentNotFound
from toolfleet.tools.documents import Document, DocumentMetadata, SearchHit


@dataclass(frozen=True, slots=True, kw_only=True)
class DocumentQuery:
    """One ``DocumentSource.get`` call."""

    document_id: str
    version: str | None = None
    """None: the latest version."""


class DocumentSource(Protocol):
    """Where documents come from (the four tools of the specification's document bridge).

    Raises:
        DocumentNotFound: no such document (or version).
        DocumentSourceUnavailable: the source did not answer, or answered malformed.
    """

    async def get(self, query: DocumentQuery) -> Document: ...
    async def metadata(self, document_id: str) -> DocumentMetadata: ...
    async def search(self, query: str, *, limit: int) -> list[SearchHit]: ...
    async def overlaps(self, document_id: str, *, limit: int) -> list[SearchHit]: ...


class MemoryDocumentSource:
    """In-process :class:`DocumentSource`: versions in a dict, ``calls`` counted."""

    def __init__(self) -> None:
        self.documents: dict[str, list[Document]] = {}
        self.calls = 0
        """Requests that reached the source (the cache tests count them)."""

    def put(self, document_id: str, content: str, *, title: str = "") -> Document:
        """Add the next version (``"1"``, ``"2"``, ...) of ``document_id``."""
        versions = self.documents.setdefault(document_id, [])
        doc = Document(
            document_id=document_id, version=str(len(versions) + 1), title=title, content=content
        )
        versions.append(doc)
        return doc

    def _versions(self, document_id: str) -> list[Document]:
        versions = self.documents.get(document_id)
        if not versions:
            raise DocumentNotFound(f"no document {document_id!r}")
        return versions

    async def get(self, query: DocumentQuery) -> Document:
        self.calls += 1
        versions = self._versions(query.document_id)
        if query.version is None:
            return versions[-1]
        for doc in versions:
            if doc.version == query.version:
                return doc
        raise DocumentNotFound(f"no version {query.version!r} of document {query.document_id!r}")

    async def metadata(self, document_id: str) -> DocumentMetadata:
        self.calls += 1
        versions = self._versions(document_id)
        return DocumentMetadata(
            document_id=document_id,
            title=versions[-1].title,
            latest_version=versions[-1].version,
            versions=[d.version for d in versions],
        )

    async def search(self, query: str, *, limit: int) -> list[SearchHit]:
        self.calls += 1
        needle = query.lower()
        hits = [
            SearchHit(
                document_id=versions[-1].document_id,
                version=versions[-1].version,
                title=versions[-1].title,
                snippet=versions[-1].content[:200],
            )
            for versions in self.documents.values()
            if versions and needle in (versions[-1].title + " " + versions[-1].content).lower()
        ]
        return hits[:limit]

    async def overlaps(self, document_id: str, *, limit: int) -> list[SearchHit]:
        self.calls += 1
        words = set(self._versions(document_id)[-1].content.lower().split())
        hits = [
            SearchHit(
                document_id=other,
                version=versions[-1].version,
                title=versions[-1].title,
                score=float(len(words & set(versions[-1].content.lower().split()))),
            )
            for other, versions in self.documents.items()
            if other != document_id and versions
        ]
        return sorted((h for h in hits if h.score > 0), key=lambda h: -h.score)[:limit]
