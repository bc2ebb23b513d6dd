"""Building terminal outcome events: one place decides type, status and id."""

from __future__ import annotations

import uuid

from toolfleet.errors import ErrorCode, ErrorInfo, ToolfleetError
from toolfleet.events.envelope import Emitted, Envelope, derived_event_id, new_event
from toolfleet.events.identity import CallRef
from toolfleet.events.models import (
    DocumentAccess,
    ExecutionMetadata,
    InvocationStatus,
    OutcomeRefusalKind,
    OutcomeRefused,
    ToolOutcome,
)
from toolfleet.events.types import EventType, Source, TopicName

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


def refused_outcome_event(
    outcome: Envelope, refused_by: Source, *, refusal: OutcomeRefusalKind, reason: str
) -> Emitted:
    """``ai.agent.tool.outcome.refused``: ``refused_by`` ignored ``outcome`` (unsigned,
    forged or misbound; ``refusal`` says which, ``reason`` which check failed).

    What the refused event named is copied as text, unverified and bounded; its auth
    attributes are dropped (claims nobody verified). The id is derived from the refused
    event, so a redelivery refuses it once.
    """
    data = outcome.data
    tenant = _text(data.get("tenant_id")) or outcome.tenantid or outcome.partitionkey or ""
    invocation = _text(data.get("invocation_id")) or outcome.invocationid or ""
    refused = OutcomeRefused(
        invocation_id=invocation[:256],
        tenant_id=tenant[:128],
        outcome_type=outcome.type[:256],
        claimed_status=_text(data.get("status"))[:64],
        actor=outcome.source[:512],
        refusal=refusal,
        reason=reason,
        refused_event_id=outcome.id,
        refused_by=refused_by.name.lower(),
    )
    parent = outcome.model_copy(update={"authtype": None, "authid": None})
    return (
        TopicName.EVENTS,
        new_event(
            event_type=EventType.OUTCOME_REFUSED,
            source=refused_by,
            data=refused,
            tenant_id=refused.tenant_id,
            invocation_id=refused.invocation_id or None,
            event_id=derived_event_id(outcome, EventType.OUTCOME_REFUSED),
            parent=parent,
        ),
    )


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
