"""The worker's ``ToolContext``: checkpoints, credentials and documents asked of the
executor over RPC (the executor's own context answers: its access checks, cache and
version pins hold for an isolated tool exactly as in-process)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from toolfleet.secrets.store import Secret
from toolfleet.tools.context import CheckpointInput, ToolContext

if TYPE_CHECKING:
    import concurrent.futures

    from toolfleet.isolation.protocol import RunJob
    from toolfleet.tools.documents import Document, DocumentMetadata, SearchHit


class RpcCaller(Protocol):
    def call(self, method: str, args: dict[str, Any]) -> concurrent.futures.Future[Any]: ...


class RemoteCheckpoints:
    """``ctx.checkpoint()`` in a worker: the executor saves it and answers its id."""

    def __init__(self, channel: RpcCaller) -> None:
        self._channel = channel

    async def save(self, checkpoint: CheckpointInput) -> str:
        answer = await asyncio.wrap_future(
            self._channel.call(
                "checkpoint",
                {
                    "state": checkpoint.state,
                    "progress_percent": checkpoint.progress_percent,
                    "current_phase": checkpoint.current_phase,
                    "name": checkpoint.name,
                },
            )
        )
        return str(answer)


class RemoteCredentials:
    """``ctx.credential(name)`` in a worker: asked of the executor's capability, on demand.

    The call blocks the worker's loop for one round trip (the API is synchronous)."""

    def __init__(self, channel: RpcCaller) -> None:
        self._channel = channel

    def get(self, name: str) -> Secret:
        return Secret(str(self._channel.call("credential", {"name": name}).result()))


class RemoteDocuments:
    """``ctx.documents`` in a worker: each read is one round trip to the executor."""

    def __init__(self, channel: RpcCaller) -> None:
        self._channel = channel

    async def _ask(self, method: str, args: dict[str, Any]) -> Any:
        return await asyncio.wrap_future(self._channel.call(f"documents.{method}", args))

    async def get(self, document_id: str) -> Document:
        from toolfleet.tools.documents import Document

        return Document.model_validate(await self._ask("get", {"document_id": document_id}))

    async def metadata(self, document_id: str) -> DocumentMetadata:
        from toolfleet.tools.documents import DocumentMetadata

        answer = await self._ask("metadata", {"document_id": document_id})
        return DocumentMetadata.model_validate(answer)

    async def search(self, query: str, *, limit: int = 10) -> list[SearchHit]:
        return _hits(await self._ask("search", {"query": query, "limit": limit}))

    async def overlaps(self, document_id: str, *, limit: int = 10) -> list[SearchHit]:
        return _hits(await self._ask("overlaps", {"document_id": document_id, "limit": limit}))


def _hits(answer: Any) -> list[SearchHit]:
    from toolfleet.tools.documents import SearchHit

    return [SearchHit.model_validate(hit) for hit in answer or []]


def remote_context(job: RunJob, channel: RpcCaller, cancel_event: asyncio.Event) -> ToolContext:
    """The context a worker hands its tool, from the job the executor sent."""
    return ToolContext(
        tenant_id=job.tenant_id,
        agent_did=job.agent_did,
        invocation_id=job.invocation_id,
        tool_id=job.tool_id,
        tool_version=job.tool_version,
        attempt=job.attempt,
        resume_state=job.resume_state,
        checkpoints=RemoteCheckpoints(channel) if job.checkpointing else None,
        cancel_event=cancel_event,
        credentials=RemoteCredentials(channel) if job.credentials else None,
        connection_id=job.connection_id,
        documents=RemoteDocuments(channel),
    )
