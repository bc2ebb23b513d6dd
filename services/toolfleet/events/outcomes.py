"""Building terminal outcome events: one place decides type, status and id."""

from __future__ import annotations

import uuid

from toolfleet.errors import ErrorCode, ErrorInfo, ToolfleetError
from toolfleet.events.envelope import Envelope, derived_event_id, new_event
from toolfleet.events.identity import CallRef
from toolfleet.events.models import (
    DocumentAccess,
    ExecutionMetadata,
    InvocationStatus,
    ToolOutcome,
)
from toolfleet.events.types import EventType, Source

_TYPE_OF_STATUS: dict[InvocationStatus, EventType] = {
    InvocationStatus.SUCCESS: EventType.SUCCEEDED,
    InvocationStatus.TIMEOUT: EventType.TIMEOUT,
    InvocationStatus.CANCELLED: EventType.CANCELLED,
    InvocationStatus.ERROR: EventType.FAILED,
    InvocationStatus.PERMISSION_DENIED: EventType.FAILED,
}


def status_for(error: ErrorInfo) -> InvocationStatus:
    """The status an error code ends an invocation in."""
    match error.code:
        case ErrorCode.TIMEOUT:
            return InvocationStatus.TIMEOUT
        case ErrorCode.CANCELLED:
            return InvocationStatus.CANCELLED
        case ErrorCode.PERMISSION_DENIED | ErrorCode.APPROVAL_DENIED:
            return InvocationStatus.PERMISSION_DENIED
        case _:
            return InvocationStatus.ERROR


def outcome_event(parent: Envelope, source: Source, outcome: ToolOutcome) -> Envelope:
    """The terminal event for ``outcome``, answering ``parent`` (deterministic id).

    All terminal types share one derived id per parent, so two stages that both try to
    end the same delivery produce one event id.
    """
    return new_event(
        event_type=_TYPE_OF_STATUS[outcome.status],
        source=source,
        data=outcome,
        tenant_id=outcome.tenant_id,
        invocation_id=str(outcome.invocation_id),
        event_id=derived_event_id(parent, "terminal"),
        parent=parent,
    )


def failure_event(
    parent: Envelope,
    source: Source,
    error: ToolfleetError | ErrorInfo,
    *,
    call: CallRef,
    warnings: list[str] | None = None,
    execution_metadata: ExecutionMetadata | None = None,
    documents_accessed: list[DocumentAccess] | None = None,
) -> Envelope:
    """The terminal failure of ``call``, answering ``parent``."""
    info = error.to_error_info() if isinstance(error, ToolfleetError) else error
    outcome = ToolOutcome(
        invocation_id=uuid.UUID(call.invocation_id),
        status=status_for(info),
        agent_did=call.agent_did,
        tenant_id=call.tenant_id,
        tool_id=call.tool_id,
        tool_version=call.tool_version,
        error=info,
        warnings=warnings or [],
        execution_metadata=execution_metadata or ExecutionMetadata(),
        documents_accessed=documents_accessed or [],
    )
    return outcome_event(parent, source, outcome)
