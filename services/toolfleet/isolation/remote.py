"""The worker's ``ToolContext``: checkpoints and credentials asked of the executor over RPC."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

from toolfleet.sdk.context import CheckpointInput, ToolContext
from toolfleet.secrets.store import Secret

if TYPE_CHECKING:
    import concurrent.futures


class Caller(Protocol):
    def call(self, method: str, args: dict[str, Any]) -> concurrent.futures.Future[Any]: ...


class RemoteCheckpoints:
    """``ctx.checkpoint()`` in a worker: the executor saves it and answers its id."""

    def __init__(self, channel: Caller) -> None:
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

    def __init__(self, channel: Caller) -> None:
        self._channel = channel

    def get(self, name: str) -> Secret:
        return Secret(str(self._channel.call("credential", {"name": name}).result()))


def remote_context(
    job: dict[str, Any], channel: Caller, cancel_event: asyncio.Event
) -> ToolContext:
    """The context a worker hands its tool, from the job the executor sent."""
    return ToolContext(
        tenant_id=job["tenant_id"],
        agent_did=job["agent_did"],
        invocation_id=job["invocation_id"],
        tool_id=job["tool_id"],
        tool_version=job["tool_version"],
        attempt=int(job.get("attempt", 1)),
        resume_state=job.get("resume_state"),
        checkpoints=RemoteCheckpoints(channel) if job.get("checkpointing") else None,
        cancel_event=cancel_event,
        credentials=RemoteCredentials(channel) if job.get("credentials") else None,
        connection_id=job.get("connection_id"),
    )
