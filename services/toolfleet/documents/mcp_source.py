"""A document source that is an MCP server, through the ``mcp`` SDK's client.

``target`` is an ``http(s)://`` URL (Streamable HTTP) or a command line (started as a
stdio server). :meth:`McpDocumentSource.run` holds the session in its own task for the
executor's lifetime (the SDK's transports must be opened and closed by one task) and
opens it again, with backoff, when it breaks; calls wait up to ``timeout_s`` for it. A
tool error of the server becomes ``document_not_found`` when it says so, any other
failure ``document_source_unavailable`` (retryable): never a crashed call.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
from typing import Any, TypeVar

from mcp import Client
from mcp.client.stdio import StdioServerParameters
from pydantic import BaseModel, ValidationError

from toolfleet.documents.source import DocumentQuery
from toolfleet.errors import DocumentNotFound, DocumentSourceUnavailable
from toolfleet.sources.models import DEFAULT_MAX_RESPONSE_BYTES
from toolfleet.sources.stdio_client import StdioConnection
from toolfleet.tools.documents import Document, DocumentMetadata, SearchHit

log = logging.getLogger(__name__)

_M = TypeVar("_M", bound=BaseModel)


class _Hits(BaseModel):
    results: list[SearchHit]


def server_of(target: str) -> StdioServerParameters | str:
    """What ``mcp.Client`` connects to for ``TOOLFLEET_DOCUMENT_SOURCE``."""
    if target.startswith(("http://", "https://")):
        return target
    argv = shlex.split(target)
    if not argv:
        raise ValueError("TOOLFLEET_DOCUMENT_SOURCE is empty")
    return StdioServerParameters(command=argv[0], args=argv[1:])


class McpDocumentSource:
    """:class:`~toolfleet.documents.source.DocumentSource` over one MCP server."""

    def __init__(self, target: str, *, timeout_s: float = 10.0, max_backoff_s: float = 5.0) -> None:
        self._server = server_of(target)
        self._timeout_s = timeout_s
        self._max_backoff_s = max_backoff_s
        self._client: Client | None = None
        self._ready = asyncio.Event()
        self._broken = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        """Keep a session open until ``stop`` (a job of the executor's worker)."""
        backoff = 0.1
        while not stop.is_set():
            self._broken.clear()
            try:
                server: str | StdioConnection = (
                    # Read off the event loop, each message capped (as a stdio tool source).
                    StdioConnection(
                        server=self._server, max_message_bytes=DEFAULT_MAX_RESPONSE_BYTES
                    )
                    if isinstance(self._server, StdioServerParameters)
                    else self._server
                )
                async with Client(server, read_timeout_seconds=self._timeout_s) as client:
                    self._client = client
                    self._ready.set()
                    backoff = 0.1
                    await _first(stop.wait(), self._broken.wait())
            except Exception as exc:  # any transport failure: reconnect, never die
                log.warning(
                    "document source session failed; reconnecting",
                    extra={"error": type(exc).__name__, "retry_in_s": backoff},
                )
            finally:
                self._ready.clear()
                self._client = None
            if not stop.is_set() and backoff:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=backoff)
                backoff = min(backoff * 2, self._max_backoff_s)

    async def get(self, query: DocumentQuery) -> Document:
        args: dict[str, Any] = {"document_id": query.document_id}
        if query.version is not None:
            args["version"] = query.version
        return _parse(Document, await self._call("get_source_of_truth", args))

    async def metadata(self, document_id: str) -> DocumentMetadata:
        answer = await self._call("get_document_metadata", {"document_id": document_id})
        return _parse(DocumentMetadata, answer)

    async def search(self, query: str, *, limit: int) -> list[SearchHit]:
        answer = await self._call("search_documents", {"query": query, "limit": limit})
        return _parse(_Hits, answer).results

    async def overlaps(self, document_id: str, *, limit: int) -> list[SearchHit]:
        answer = await self._call("find_overlaps", {"document_id": document_id, "limit": limit})
        return _parse(_Hits, answer).results

    def _discard(self, client: Client | None) -> None:
        """The session failed a call: no call may use it again; :meth:`run` opens another."""
        if client is not None and client is self._client:
            self._client = None
            self._ready.clear()
            self._broken.set()

    async def _call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        client: Client | None = None
        try:
            async with asyncio.timeout(self._timeout_s):
                while client is None:
                    await self._ready.wait()
                    client = self._client
                result = await client.call_tool(tool, arguments)
        except TimeoutError:
            self._discard(client)  # a request it never answered: it may be stuck
            raise DocumentSourceUnavailable(
                f"the document source did not answer {tool} in time", retry_after_s=1.0
            ) from None
        except Exception as exc:
            self._discard(client)
            raise DocumentSourceUnavailable(
                f"the document source failed on {tool}: {type(exc).__name__}", retry_after_s=1.0
            ) from None
        if result.is_error:
            text = " ".join(getattr(block, "text", "") for block in result.content)
            if "document_not_found" in text or "not found" in text.lower():
                raise DocumentNotFound(f"the document source has no such document ({tool})")
            raise DocumentSourceUnavailable(f"the document source refused {tool}")
        if not isinstance(result.structured_content, dict):
            raise DocumentSourceUnavailable(f"the document source answered {tool} without data")
        return result.structured_content


def _parse(model: type[_M], answer: dict[str, Any]) -> _M:
    try:
        return model.model_validate(answer)
    except ValidationError:
        raise DocumentSourceUnavailable(
            f"the document source answered malformed ({model.__name__})"
        ) from None


async def _first(*waits: Any) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
