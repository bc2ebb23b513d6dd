"""One way to build an invoke request from keyword options, and one ``invoke`` for both
transports (:class:`RequestPublisher`)."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from typing import Any, Required, TypedDict, Unpack

from toolfleet.client.handles import InvocationHandle
from toolfleet.events.models import (
    AgentContext,
    CheckpointConfig,
    DocumentContext,
    ExecutionOptions,
    InvokeRequested,
    Priority,
    ResourceLimits,
)


class InvokeOptions(TypedDict, total=False):
    """The keyword options of an invoke: :func:`invoke_request`, and each client's
    ``invoke`` and ``call``. Only ``tenant_id`` and ``agent_did`` are required."""

    tenant_id: Required[str]
    agent_did: Required[str]
    tool_version: str
    """A version or semver range (default ``*``: the newest active version)."""
    capability_token: str | None
    invocation_id: str | None
    """Default: a fresh one."""
    user_did: str | None
    session_id: str
    connection_id: str | None
    timeout_seconds: float | None
    idempotency_key: str | None
    require_approval: bool
    priority: Priority
    enable_checkpointing: bool
    """Default ``True``."""
    document_context: DocumentContext | None
    """The documents the tool may read (``ctx.documents``), optionally pinned to versions."""
    traceparent: str | None
    """A W3C ``traceparent``: the call joins the caller's trace (default: the current
    span's, else a trace of its own). Not part of the request's data."""


def invoke_request(
    tool_id: str, parameters: dict[str, Any] | None = None, **options: Unpack[InvokeOptions]
) -> InvokeRequested:
    """The ``invoke.requested`` data for a call (a fresh invocation id unless given)."""
    invocation_id = options.get("invocation_id")
    return InvokeRequested(
        invocation_id=uuid.UUID(invocation_id) if invocation_id else uuid.uuid4(),
        tool_id=tool_id,
        tool_version=options.get("tool_version", "*"),
        agent_context=AgentContext(
            agent_did=options["agent_did"],
            tenant_id=options["tenant_id"],
            user_did=options.get("user_did"),
            session_id=options.get("session_id", ""),
        ),
        parameters=parameters or {},
        capability_token=options.get("capability_token"),
        connection_id=options.get("connection_id"),
        resource_limits=ResourceLimits(timeout_seconds=options.get("timeout_seconds")),
        checkpoint_config=CheckpointConfig(
            enable_checkpointing=options.get("enable_checkpointing", True)
        ),
        execution_options=ExecutionOptions(
            idempotency_key=options.get("idempotency_key"),
            require_approval=options.get("require_approval", False),
            priority=options.get("priority", Priority.NORMAL),
        ),
        document_context=options.get("document_context"),
    )


class RequestPublisher(ABC):
    """A transport that publishes prepared requests; ``invoke`` is written once, here."""

    @abstractmethod
    async def publish(
        self, request: InvokeRequested, *, traceparent: str | None = None
    ) -> InvocationHandle:
        """Submit a prepared request; ``traceparent`` joins the caller's trace."""

    async def invoke(
        self,
        tool_id: str,
        parameters: dict[str, Any] | None = None,
        **options: Unpack[InvokeOptions],
    ) -> InvocationHandle:
        """Build the request (:func:`invoke_request`) and :meth:`publish` it; returns once
        the transport has taken it (the broker's ack, or the API's ``202``)."""
        return await self.publish(
            invoke_request(tool_id, parameters, **options), traceparent=options.get("traceparent")
        )
