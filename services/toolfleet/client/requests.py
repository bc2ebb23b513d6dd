"""One way to build an invoke request from keyword options, and one ``invoke`` for both
transports (:class:`RequestPublisher`)."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from typing import Any

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


def invoke_request(
    tool_id: str,
    parameters: dict[str, Any] | None = None,
    *,
    tenant_id: str,
    agent_did: str,
    tool_version: str = "*",
    capability_token: str | None = None,
    invocation_id: str | None = None,
    user_did: str | None = None,
    session_id: str = "",
    connection_id: str | None = None,
    timeout_seconds: float | None = None,
    idempotency_key: str | None = None,
    require_approval: bool = False,
    priority: Priority = Priority.NORMAL,
    enable_checkpointing: bool = True,
    document_context: DocumentContext | None = None,
) -> InvokeRequested:
    """The ``invoke.requested`` data for a call (a fresh invocation id unless given).

    ``document_context`` names the documents the tool may read (``ctx.documents``),
    optionally pinned to versions."""
    return InvokeRequested(
        invocation_id=uuid.UUID(invocation_id) if invocation_id else uuid.uuid4(),
        tool_id=tool_id,
        tool_version=tool_version,
        agent_context=AgentContext(
            agent_did=agent_did, tenant_id=tenant_id, user_did=user_did, session_id=session_id
        ),
        parameters=parameters or {},
        capability_token=capability_token,
        connection_id=connection_id,
        resource_limits=ResourceLimits(timeout_seconds=timeout_seconds),
        checkpoint_config=CheckpointConfig(enable_checkpointing=enable_checkpointing),
        execution_options=ExecutionOptions(
            idempotency_key=idempotency_key,
            require_approval=require_approval,
            priority=priority,
        ),
        document_context=document_context,
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
        *,
        tenant_id: str,
        agent_did: str,
        tool_version: str = "*",
        capability_token: str | None = None,
        invocation_id: str | None = None,
        user_did: str | None = None,
        session_id: str = "",
        connection_id: str | None = None,
        timeout_seconds: float | None = None,
        idempotency_key: str | None = None,
        require_approval: bool = False,
        priority: Priority = Priority.NORMAL,
        enable_checkpointing: bool = True,
        document_context: DocumentContext | None = None,
    ) -> InvocationHandle:
        """Build the request (:func:`invoke_request`) and :meth:`publish` it; returns once
        the transport has taken it (the broker's ack, or the API's ``202``)."""
        request = invoke_request(
            tool_id,
            parameters,
            tenant_id=tenant_id,
            agent_did=agent_did,
            tool_version=tool_version,
            capability_token=capability_token,
            invocation_id=invocation_id,
            user_did=user_did,
            session_id=session_id,
            connection_id=connection_id,
            timeout_seconds=timeout_seconds,
            idempotency_key=idempotency_key,
            require_approval=require_approval,
            priority=priority,
            enable_checkpointing=enable_checkpointing,
            document_context=document_context,
        )
        return await self.publish(request)
