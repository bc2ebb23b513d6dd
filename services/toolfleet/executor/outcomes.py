"""What a run emits: the events it builds and the checks its output passes first.

Pure functions over the run's input: no ports. Every event's id is derived from the
``invoke.authorized`` event it answers, so a redelivery emits the very same events.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from toolfleet.errors import ErrorInfo, ResourceExhausted, ToolfleetError
from toolfleet.events.envelope import Emitted, Envelope, derived_event_id, new_event
from toolfleet.events.large_results import encode_result
from toolfleet.events.models import (
    CircuitChanged,
    DocumentAccess,
    ExecutionMetadata,
    InvokeExecuted,
    ResultBlob,
    ToolInvoked,
)
from toolfleet.events.outcomes import failure_event
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.executor.admission import RunInput
from toolfleet.executor.circuits.breaker import CircuitStatus, Transition
from toolfleet.executor.runner import RunResult
from toolfleet.secrets.capability import LeakDetector, withheld_output

log = logging.getLogger(__name__)


def failed(
    run: RunInput,
    error: ToolfleetError | ErrorInfo,
    metadata: ExecutionMetadata,
    documents_accessed: list[DocumentAccess] | None = None,
) -> Emitted:
    """The call's terminal failure, straight to ``tool.results``."""
    call = run.call
    return (
        TopicName.RESULTS,
        failure_event(
            run.event,
            Source.EXECUTOR,
            error,
            call=run.ref,
            warnings=call.warnings,
            execution_metadata=metadata,
            documents_accessed=documents_accessed,
        ),
    )


def executed(
    run: RunInput,
    result: dict[str, Any],
    blob: ResultBlob | None,
    metadata: ExecutionMetadata,
    checkpoint_ref: str | None,
    documents_accessed: list[DocumentAccess] | None = None,
) -> Emitted:
    """A successful run, on to the validator as ``invoke.executed``."""
    call = run.call
    data = InvokeExecuted(
        invocation_id=call.invocation_id,
        tool_id=call.tool_id,
        tool_version=call.tool_version,
        agent_context=call.agent_context,
        result=result,
        result_blob=blob,
        warnings=call.warnings,
        execution_metadata=metadata,
        checkpoint_ref=checkpoint_ref,
        documents_accessed=documents_accessed or [],
    )
    return (
        TopicName.EXECUTED,
        new_event(
            event_type=EventType.INVOKE_EXECUTED,
            source=Source.EXECUTOR,
            data=data,
            tenant_id=run.ref.tenant_id,
            invocation_id=run.invocation_id,
            event_id=derived_event_id(run.event, EventType.INVOKE_EXECUTED),
            parent=run.event,
        ),
    )


def invoked(
    run: RunInput, *, worker_id: str, started_at: datetime, resumed_from: str | None
) -> Envelope:
    """``ai.agent.tool.invoked``: the tool starts now (pollers see ``running``)."""
    call, attempt = run.call, run.prior_runs + 1
    return new_event(
        event_type=EventType.INVOKED,
        source=Source.EXECUTOR,
        data=ToolInvoked(
            invocation_id=call.invocation_id,
            tenant_id=run.ref.tenant_id,
            agent_did=run.ref.agent_did,
            tool_id=call.tool_id,
            tool_version=call.tool_version,
            attempt=attempt,
            worker_id=worker_id,
            started_at=started_at,
            resumed_from_checkpoint_id=resumed_from,
        ),
        tenant_id=run.ref.tenant_id,
        invocation_id=run.invocation_id,
        # One per run: a takeover from the same checkpoint is a new start.
        event_id=derived_event_id(run.event, EventType.INVOKED, f"{attempt}:{resumed_from or ''}"),
        parent=run.event,
    )


def circuit_changed(run: RunInput, transition: Transition, attempt: int) -> Envelope | None:
    """``ai.agent.circuit.opened|closed`` for a transition this call caused."""
    if transition.status is CircuitStatus.HALF_OPEN:
        return None  # published on circuit:state:changes only; not a contract event
    event_type = (
        EventType.CIRCUIT_OPENED
        if transition.status is CircuitStatus.OPEN
        else EventType.CIRCUIT_CLOSED
    )
    return new_event(
        event_type=event_type,
        source=Source.EXECUTOR,
        data=CircuitChanged(
            circuit_name=transition.circuit_name,
            state=transition.status.value,
            reason=transition.reason,
            retry_after_s=transition.retry_after_s,
            at=datetime.now(UTC),
        ),
        tenant_id=run.ref.tenant_id,
        invocation_id=run.invocation_id,
        event_id=derived_event_id(run.event, event_type, f"{transition.circuit_name}:{attempt}"),
        parent=run.event,
    )


def screened(
    run: RunInput, result: RunResult, leaks: LeakDetector, tool_id: str
) -> tuple[RunResult, bytes]:
    """The result within the call's byte budget and free of credentials, and its bytes.

    An over-budget result becomes ``resource_exhausted``; one that carries a resolved
    credential (or its base64) becomes ``redaction_failed`` and is never emitted.
    """
    budget = run.call.max_result_bytes
    encoded = encode_result(result.result) if result.result is not None else b""
    if result.result is not None and budget is not None and len(encoded) > budget:
        result = RunResult(
            error=ResourceExhausted(
                f"the result is {len(encoded)} bytes, over the budget of {budget} bytes",
                details={"bytes": len(encoded), "budget": budget},
            ).to_error_info()
        )
    withheld = withheld_output(leaks, tool_id, [result.result, result.error])
    if withheld is not None:
        log.warning("tool output carried a credential; withheld", extra={"tool_id": tool_id})
        result = RunResult(error=withheld.to_error_info())
    return result, encoded
