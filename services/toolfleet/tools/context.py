"""What a running tool sees of toolfleet: who called, checkpoints, cancellation,
credentials and documents."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from toolfleet.errors import DocumentAccessDenied, PermissionDenied

if TYPE_CHECKING:
    from toolfleet.secrets.store import Secret
    from toolfleet.tools.documents import Document, DocumentMetadata, SearchHit


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointInput:
    """One ``ToolContext.checkpoint`` call, handed to the executor's sink."""

    state: dict[str, Any]
    progress_percent: float
    current_phase: str
    name: str | None = None
    """Set for a named checkpoint: always kept durably, with its history."""


class CheckpointWriter(Protocol):
    """Where checkpoints go (the executor writes Redis and emits an event)."""

    async def save(self, checkpoint: CheckpointInput) -> str: ...


class CredentialSource(Protocol):
    """The credentials of one call (the executor's invocation-scoped capability)."""

    def get(self, name: str) -> Secret: ...


class DocumentReader(Protocol):
    """``ctx.documents``: the documents of the request's ``document_context``.

    Async throughout, so an isolated tool process can be handed a proxy of it. The
    executor's one is :class:`toolfleet.documents.reader.CallDocuments`; every method
    raises the ``document_*`` errors (a tool that lets one escape ends with that code).
    """

    async def get(self, document_id: str) -> Document:
        """The content, at the version the call is pinned to (first read, or request)."""
        ...

    async def metadata(self, document_id: str) -> DocumentMetadata: ...
    async def search(self, query: str, *, limit: int = 10) -> list[SearchHit]: ...
    async def overlaps(self, document_id: str, *, limit: int = 10) -> list[SearchHit]: ...


class _NoDocuments:
    """``ctx.documents`` of a context built without documents (tests, direct calls)."""

    def _deny(self) -> DocumentAccessDenied:
        return DocumentAccessDenied("this call has no document_context")

    async def get(self, document_id: str) -> Document:
        raise self._deny()

    async def metadata(self, document_id: str) -> DocumentMetadata:
        raise self._deny()

    async def search(self, query: str, *, limit: int = 10) -> list[SearchHit]:
        raise self._deny()

    async def overlaps(self, document_id: str, *, limit: int = 10) -> list[SearchHit]:
        raise self._deny()


class ToolContext:
    """Handed to every tool call: identities, checkpoints, cancellation and credentials.

    It holds no secret itself: ``credential(name)`` asks the invocation's capability,
    which the executor fills at execution time and revokes when the call returns.
    """

    def __init__(
        self,
        *,
        tenant_id: str,
        agent_did: str,
        invocation_id: str,
        tool_id: str,
        tool_version: str,
        attempt: int = 1,
        resume_state: dict[str, Any] | None = None,
        checkpoints: CheckpointWriter | None = None,
        cancel_event: asyncio.Event | None = None,
        credentials: CredentialSource | None = None,
        connection_id: str | None = None,
        documents: DocumentReader | None = None,
    ) -> None:
        self.tenant_id = tenant_id
        self.agent_did = agent_did
        self.invocation_id = invocation_id
        self.tool_id = tool_id
        self.tool_version = tool_version
        self.attempt = attempt
        self._resume_state = resume_state
        self._checkpoints = checkpoints
        self._cancel_event = cancel_event or asyncio.Event()
        self._credentials = credentials
        self.connection_id = connection_id
        """The connection whose credentials this call may use (None: no connection)."""
        self.documents: DocumentReader = documents or _NoDocuments()
        """The documents the request's ``document_context`` names: ``await
        ctx.documents.get(id)``, ``.metadata(id)``, ``.search(q)``, ``.overlaps(id)``.
        Any other document is refused (``document_access_denied``); a document's version
        is pinned at the call's first read of it, and kept across resumes."""

    def resume_state(self) -> dict[str, Any] | None:
        """The state of the last checkpoint of this invocation, or None on a fresh start."""
        return None if self._resume_state is None else dict(self._resume_state)

    async def checkpoint(
        self,
        state: dict[str, Any],
        progress_percent: float = 0.0,
        current_phase: str = "",
        *,
        name: str | None = None,
    ) -> str | None:
        """Save progress; after a crash the invocation resumes from here, on any worker.

        Every checkpoint replaces the hot copy in Redis (``micro``). The first one of a
        run, and then one at least every ``checkpoint_interval_seconds``, is also kept in
        Postgres (``macro``), as is every checkpoint given a ``name`` (``named``): those
        survive the hot copy and can be resumed from by id (``resume_from_checkpoint_id``).

        Returns the checkpoint id, or None when checkpointing is disabled for the call.
        """
        if self._checkpoints is None:
            return None
        progress = min(max(float(progress_percent), 0.0), 100.0)
        return await self._checkpoints.save(
            CheckpointInput(
                state=state, progress_percent=progress, current_phase=current_phase, name=name
            )
        )

    @property
    def cancelled(self) -> bool:
        """True once cancellation was requested; long tools should stop soon after."""
        return self._cancel_event.is_set()

    def credential(self, name: str) -> Secret:
        """The credential ``name`` of this call's connection, as a masked :class:`Secret`.

        Only names the tool declared (``@tool(sandbox=Sandbox(permissions=ToolPermissions(
        credentials=[...])))``) resolve, and only
        while the call runs. Use ``.reveal()`` at the one place that needs the value
        (an HTTP header, a client constructor); never log it, put it in a checkpoint or
        return it: the executor fails a call whose output contains it
        (``redaction_failed``).

        Raises:
            PermissionDenied: the name was not declared, or the call has returned.
        """
        if self._credentials is None:
            raise PermissionDenied(f"{self.tool_id} declared no credentials")
        return self._credentials.get(name)
