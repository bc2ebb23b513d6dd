"""Builds the events of one invocation's lifecycle, as the services would emit them."""

from __future__ import annotations

import secrets
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from toolfleet.errors import ErrorCode, ErrorInfo
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.models import (
    AgentContext,
    ApprovalDecision,
    ApprovalRequested,
    CancelRequested,
    CheckpointCreated,
    Effect,
    ExecutionMetadata,
    ExecutionOptions,
    InvocationStatus,
    InvokeAuthorized,
    InvokeExecuted,
    Priority,
    ToolInvoked,
    ToolOutcome,
)
from toolfleet.events.outcomes import outcome_event
from toolfleet.events.types import EventType, Source

T0 = datetime(2025, 1, 1, 12, 0, tzinfo=UTC)


@dataclass
class Lifecycle:
    """One invocation; each method returns one event of it (event time = ``T0 + at`` s)."""

    tenant: str = "t_acme"
    agent: str = "did:agent:test"
    tool_id: str = "core__echo"
    version: str = "1.0.0"
    invocation_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    traceparent: str = field(
        default_factory=lambda: f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    )
    parameters: dict[str, Any] = field(default_factory=lambda: {"message": "hi"})
    authid: str = "did:agent:test"

    @property
    def context(self) -> AgentContext:
        return AgentContext(agent_did=self.agent, tenant_id=self.tenant, user_did="did:user:u1")

    def _at(self, env: Envelope, at: float) -> Envelope:
        return env.model_copy(update={"time": T0 + timedelta(seconds=at)})

    def _event(
        self, event_type: EventType, source: Source, data: Any, at: float, *, auth: bool = True
    ) -> Envelope:
        env = new_event(
            event_type=event_type,
            source=source,
            data=data,
            tenant_id=self.tenant,
            invocation_id=self.invocation_id,
            traceparent=self.traceparent,
            authtype="app_user" if auth else None,
            authid=self.authid if auth else None,
        )
        return self._at(env, at)

    def requested(self, at: float = 0, **extra: Any) -> Envelope:
        data = {
            "invocation_id": self.invocation_id,
            "tool_id": self.tool_id,
            "tool_version": "^1.0.0",
            "agent_context": self.context.model_dump(),
            "parameters": self.parameters,
            "capability_token": "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl",
            "execution_options": {"priority": "high", "idempotency_key": "idem-1"},
            **extra,
        }
        return self._event(EventType.INVOKE_REQUESTED, Source.CLIENT, data, at, auth=False)

    def authorized(self, at: float = 1) -> Envelope:
        data = InvokeAuthorized(
            invocation_id=uuid.UUID(self.invocation_id),
            tool_id=self.tool_id,
            tool_version=self.version,
            requested_version="^1.0.0",
            agent_context=self.context,
            parameters=self.parameters,
            effect=Effect.READ_ONLY,
            timeout_seconds=30,
            execution_options=ExecutionOptions(priority=Priority.HIGH, idempotency_key="idem-1"),
            warnings=["tool core__echo@1.0.0 is deprecated"],
            requested_at=T0,
        )
        return self._event(EventType.INVOKE_AUTHORIZED, Source.POLICY, data, at)

    def approval_requested(self, at: float = 1) -> Envelope:
        data = ApprovalRequested(
            invocation_id=uuid.UUID(self.invocation_id),
            tenant_id=self.tenant,
            agent_did=self.agent,
            tool_id=self.tool_id,
            tool_version=self.version,
            effect=Effect.EXTERNAL_SIDE_EFFECT,
            reason="needs a human",
            parameters_hash="0" * 64,
            expires_at=T0 + timedelta(hours=1),
        )
        return self._event(EventType.APPROVAL_REQUESTED, Source.POLICY, data, at)

    def approval(self, *, granted: bool, at: float = 2) -> Envelope:
        data = ApprovalDecision(
            invocation_id=uuid.UUID(self.invocation_id),
            tenant_id=self.tenant,
            approver="did:user:approver",
            reason="ok" if granted else "no",
        )
        kind = EventType.APPROVAL_GRANTED if granted else EventType.APPROVAL_DENIED
        return self._event(kind, Source.API, data, at)

    def cancel_requested(self, at: float = 4) -> Envelope:
        data = CancelRequested(
            invocation_id=uuid.UUID(self.invocation_id),
            tenant_id=self.tenant,
            requested_by="did:user:canceller",
            reason="changed my mind",
        )
        return self._event(EventType.CANCEL_REQUESTED, Source.API, data, at)

    def invoked(self, at: float = 2, attempt: int = 1) -> Envelope:
        data = ToolInvoked(
            invocation_id=uuid.UUID(self.invocation_id),
            tenant_id=self.tenant,
            agent_did=self.agent,
            tool_id=self.tool_id,
            tool_version=self.version,
            attempt=attempt,
            worker_id="w1",
            started_at=T0 + timedelta(seconds=at),
        )
        return self._event(EventType.INVOKED, Source.EXECUTOR, data, at)

    def checkpoint(self, progress: float, phase: str = "", at: float = 3) -> Envelope:
        data = CheckpointCreated(
            invocation_id=uuid.UUID(self.invocation_id),
            tenant_id=self.tenant,
            tool_id=self.tool_id,
            checkpoint_id=f"cp-{progress:g}",
            progress_percent=progress,
            current_phase=phase,
            timestamp=T0 + timedelta(seconds=at),
        )
        return self._event(EventType.CHECKPOINT_CREATED, Source.EXECUTOR, data, at)

    def executed(self, at: float = 5) -> Envelope:
        data = InvokeExecuted(
            invocation_id=uuid.UUID(self.invocation_id),
            tool_id=self.tool_id,
            tool_version=self.version,
            agent_context=self.context,
            result={"message": "hi", "length": 2},
            execution_metadata=self.metadata(),
        )
        return self._event(EventType.INVOKE_EXECUTED, Source.EXECUTOR, data, at)

    def metadata(self) -> ExecutionMetadata:
        return ExecutionMetadata(
            duration_ms=1500,
            started_at=T0 + timedelta(seconds=2),
            completed_at=T0 + timedelta(seconds=5),
            attempts=1,
        )

    def outcome(
        self,
        status: InvocationStatus = InvocationStatus.SUCCESS,
        *,
        at: float = 6,
        result: dict[str, Any] | None = None,
        code: ErrorCode = ErrorCode.TOOL_EXECUTION_ERROR,
    ) -> Envelope:
        success = status is InvocationStatus.SUCCESS
        outcome = ToolOutcome(
            invocation_id=uuid.UUID(self.invocation_id),
            status=status,
            agent_did=self.agent,
            tenant_id=self.tenant,
            tool_id=self.tool_id,
            tool_version=self.version,
            result=(result or {"message": "hi", "length": 2}) if success else None,
            error=None if success else ErrorInfo(code=code, message="it broke"),
            warnings=["tool core__echo@1.0.0 is deprecated"],
            execution_metadata=self.metadata(),
        )
        parent = self.requested()
        parent = parent.model_copy(update={"traceparent": self.traceparent})
        env = outcome_event(parent, Source.VALIDATOR, outcome)
        env = env.model_copy(update={"authtype": "app_user", "authid": self.authid})
        return self._at(env, at)
