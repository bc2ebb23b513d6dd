"""One way to build an invoke request from keyword options, for both transports."""

from __future__ import annotations

import uuid
from typing import Any

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
