"""``ctx.documents``: the documents one call may read, pinned, cached, and listed.

Access: a call reads only the documents its request's ``document_context`` names; any
other id, and every id when the request has no ``document_context``, is refused with
``document_access_denied`` (searches return only named documents). The capability token
was checked by policy for the tool; naming the documents is the caller's own, narrower
grant, so a tool cannot wander through a source on behalf of an agent.

Versions: a version named in the request is the pin. Otherwise the first read pins the
version it got (:mod:`~toolfleet.documents.pins`), and every later read of that call,
in this run or a resumed one, gets that version, even after the document changed.

Every access is listed once per (document, kind) in the outcome's ``documents_accessed``.

In a tool's own tests (core install, no Redis)::

    source = MemoryDocumentSource()
    source.put("handbook", "first edition")
    docs = CallDocuments(context=DocumentContext(documents=[DocumentRef(document_id="handbook")]),
                         source=source, pins=MemoryDocumentPins())
    ctx = context_for(my_tool, documents=docs)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolfleet.documents.pins import DocumentPins
from toolfleet.documents.source import DocumentQuery, DocumentSource
from toolfleet.errors import (
    DocumentAccessDenied,
    DocumentSourceUnavailable,
    DocumentVersionConflict,
)
from toolfleet.events.models import DocumentAccess, DocumentContext, DocumentRef
from toolfleet.tools.documents import Document, DocumentMetadata, SearchHit

if TYPE_CHECKING:  # Redis-backed: the executor passes one; tool authors' tests need none
    from toolfleet.documents.cache import DocumentCache

MAX_SEARCH_LIMIT = 100


class CallDocuments:
    """What ``ctx.documents`` is for one call (an async API: it can be proxied into an
    isolated tool process as it stands)."""

    def __init__(
        self,
        *,
        context: DocumentContext | None,
        source: DocumentSource | None,
        pins: DocumentPins,
        cache: DocumentCache | None = None,
        source_name: str = "default",
    ) -> None:
        self._refs: dict[str, DocumentRef] = (
            {} if context is None else {ref.document_id: ref for ref in context.documents}
        )
        wrong_source = context is not None and context.source not in (None, source_name)
        self._source = None if wrong_source else source
        self._missing = (
            f"this executor has no document source named {context.source!r}"
            if wrong_source and context is not None
            else "this executor has no document source configured"
        )
        self._pins = pins
        self._cache = cache
        self._accessed: dict[tuple[str, str], DocumentAccess] = {}

    @property
    def allowed(self) -> list[str]:
        """The document ids this call may read."""
        return list(self._refs)

    @property
    def accessed(self) -> list[DocumentAccess]:
        """What the call read so far, in order (the outcome's ``documents_accessed``)."""
        return list(self._accessed.values())

    async def get(self, document_id: str) -> Document:
        """The document's content, at the call's pinned version.

        Raises:
            DocumentAccessDenied: the request's ``document_context`` does not name it.
            DocumentNotFound: the source has no such document (or pinned version).
            DocumentVersionConflict: the source answered with another version.
            DocumentSourceUnavailable: no source, or it did not answer (retryable).
        """
        ref = self._allowed(document_id)
        source = self._require_source()
        version = await self._pinned(ref)
        if version is None:
            # The latest version through the (shared, invalidated) metadata, then pinned:
            # a concurrent run of the same call may have pinned first, and wins.
            meta = await self._latest(source, document_id)
            version = await self._pins.pin(document_id, meta.latest_version)
        doc = await self._content(source, document_id, version)
        self._record(document_id, version, "read")
        return doc

    async def metadata(self, document_id: str) -> DocumentMetadata:
        """What the source knows of the document now (``latest_version`` may be past the
        call's pin, which ``documents_accessed`` reports)."""
        ref = self._allowed(document_id)
        source = self._require_source()
        meta = await self._latest(source, document_id)
        pinned = await self._pinned(ref)
        self._record(document_id, pinned or meta.latest_version, "metadata")
        return meta

    async def search(self, query: str, *, limit: int = 10) -> list[SearchHit]:
        """Search the source; only documents the call may read are returned."""
        source = self._require_source()
        wanted = max(1, min(limit, MAX_SEARCH_LIMIT))
        hits = await source.search(query, limit=MAX_SEARCH_LIMIT)
        mine = [hit for hit in hits if hit.document_id in self._refs][:wanted]
        for hit in mine:
            self._record(hit.document_id, hit.version, "search")
        return mine

    async def overlaps(self, document_id: str, *, limit: int = 10) -> list[SearchHit]:
        """Documents overlapping ``document_id``, among those the call may read."""
        self._allowed(document_id)
        source = self._require_source()
        hits = await source.overlaps(document_id, limit=MAX_SEARCH_LIMIT)
        mine = [hit for hit in hits if hit.document_id in self._refs][: max(1, limit)]
        for hit in mine:
            self._record(hit.document_id, hit.version, "search")
        return mine

    def _allowed(self, document_id: str) -> DocumentRef:
        ref = self._refs.get(document_id)
        if ref is None:
            raise DocumentAccessDenied(
                "the request's document_context does not name this document",
                details={"document_id": document_id[:256]},
            )
        return ref

    def _require_source(self) -> DocumentSource:
        if self._source is None:
            raise DocumentSourceUnavailable(self._missing)
        return self._source

    async def _pinned(self, ref: DocumentRef) -> str | None:
        if ref.version is not None:
            return ref.version  # the request's pin: nothing to remember
        return await self._pins.get(ref.document_id)

    async def _latest(self, source: DocumentSource, document_id: str) -> DocumentMetadata:
        meta = await self._cache.metadata(document_id) if self._cache else None
        if meta is None:
            meta = await source.metadata(document_id)
            if self._cache is not None:
                await self._cache.put_metadata(meta)
        return meta

    async def _content(self, source: DocumentSource, document_id: str, version: str) -> Document:
        doc = await self._cache.content(document_id, version) if self._cache else None
        if doc is None:
            doc = await source.get(DocumentQuery(document_id=document_id, version=version))
            if doc.version != version:
                raise DocumentVersionConflict(
                    f"the call is pinned to version {version} but the source answered another",
                    details={"document_id": document_id, "pinned": version, "got": doc.version},
                )
            if self._cache is not None:
                await self._cache.put_content(doc)
        return doc

    def _record(self, document_id: str, version: str, access: str) -> None:
        key = (document_id, access)
        if key not in self._accessed:
            self._accessed[key] = DocumentAccess.model_validate(
                {"document_id": document_id, "version": version, "access": access}
            )
