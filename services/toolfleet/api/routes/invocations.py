"""``/v1/invocations``: submit, read, list, cancel and resolve approvals.

Reads come from the status projection; writes are events published through
:class:`~toolfleet.sdk.client.ToolfleetClient`, so the API holds no state of its own.
Another tenant's invocation is answered exactly like an unknown one (404).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated
from uuid import UUID

from aiokafka.errors import KafkaError
from fastapi import APIRouter, Body, Depends, Header, Query, Response

from toolfleet.api.auth import Caller, CallerDep
from toolfleet.api.models import (
    CancelResult,
    ControlBody,
    DecisionResult,
    InvocationPage,
    InvocationView,
    InvokeAccepted,
    PollingInfo,
)
from toolfleet.api.problems import ProblemError, problem_responses
from toolfleet.api.queries import Cursor, InvalidCursor, InvocationFilter
from toolfleet.api.resources import ApiResources, resources
from toolfleet.errors import ErrorCode
from toolfleet.events.models import TOOL_ID_PATTERN, InvocationStatus, InvokeRequested

router = APIRouter(
    prefix="/v1/invocations", tags=["invocations"], responses=problem_responses(401, 422)
)

ResourcesDep = Annotated[ApiResources, Depends(resources)]
ControlBodyDep = Annotated[ControlBody | None, Body()]

POLL_INTERVAL_MS = 500
MAX_PAGE_SIZE = 200
_TRACEPARENT = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


@asynccontextmanager
async def _publishing() -> AsyncIterator[None]:
    """Wrap a publish: a broker outage is a 503 the client may retry."""
    try:
        yield
    except (KafkaError, TimeoutError):
        raise ProblemError(
            503,
            "the event broker is unavailable; retry later",
            code=ErrorCode.INTERNAL_ERROR,
            headers={"Retry-After": "1"},
        ) from None


async def _visible(res: ApiResources, caller: Caller, invocation_id: UUID) -> InvocationView:
    """The invocation if this caller may see it; otherwise 404, as if it did not exist."""
    view = await res.invocations.get(invocation_id, tenant_id=caller.tenant_scope)
    if view is None:
        raise ProblemError(404, "no such invocation", code="not_found")
    return view


@router.post(
    "", status_code=202, response_model=InvokeAccepted, responses=problem_responses(403, 503)
)
async def submit(
    request: InvokeRequested,
    caller: CallerDep,
    res: ResourcesDep,
    traceparent: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> InvokeAccepted:
    """Publish an invoke request; poll ``polling_info.status_url`` for its outcome.

    Without a ``capability_token`` in the body, the bearer token is the capability.
    A valid W3C ``traceparent`` header makes the invocation part of the caller's trace.
    """
    if not caller.may_see(request.agent_context.tenant_id):
        raise ProblemError(
            403,
            "agent_context.tenant_id does not match the token's tenant",
            code=ErrorCode.PERMISSION_DENIED,
        )
    if request.capability_token is None:
        request = request.model_copy(update={"capability_token": caller.token})
    trace = traceparent if traceparent and _TRACEPARENT.match(traceparent) else None
    async with _publishing():
        handle = await res.client.publish(request, traceparent=trace)
    status_url = f"{res.settings.api_url.rstrip('/')}/v1/invocations/{handle.invocation_id}"
    return InvokeAccepted(
        invocation_id=handle.invocation_id,
        polling_info=PollingInfo(status_url=status_url, poll_interval_ms=POLL_INTERVAL_MS),
    )


@router.get("", response_model=InvocationPage)
async def list_invocations(
    caller: CallerDep,
    res: ResourcesDep,
    status: InvocationStatus | None = None,
    tool_id: Annotated[str | None, Query(pattern=TOOL_ID_PATTERN, max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 50,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> InvocationPage:
    """The caller's tenant's invocations, newest first (an admin sees every tenant)."""
    try:
        after = Cursor.decode(cursor) if cursor else None
    except InvalidCursor as exc:
        raise ProblemError(422, str(exc), code=ErrorCode.INVALID_PARAMETERS) from None
    return await res.invocations.page(
        InvocationFilter(
            tenant_id=caller.tenant_scope, status=status, tool_id=tool_id, limit=limit, after=after
        )
    )


@router.get("/{invocation_id}", response_model=InvocationView, responses=problem_responses(404))
async def get_invocation(
    invocation_id: UUID, caller: CallerDep, res: ResourcesDep
) -> InvocationView:
    """Status, progress and, once finished, the outcome of one invocation.

    The projection trails the publish by a few milliseconds: right after ``POST`` a
    404 means "not yet", so poll again.
    """
    return await _visible(res, caller, invocation_id)


@router.get(
    "/{invocation_id}/attachments/{blob_id}",
    response_class=Response,
    responses={
        **problem_responses(404),
        200: {"description": "the attachment's bytes", "content": {"application/json": {}}},
    },
)
async def get_attachment(
    invocation_id: UUID, blob_id: UUID, caller: CallerDep, res: ResourcesDep
) -> Response:
    """An attachment of the invocation's outcome: its whole result when the outcome
    carries a truncated preview (``execution_metadata.attachments[].url``)."""
    blob = await res.blobs.get(
        str(blob_id),
        purpose="attachment",
        tenant_id=caller.tenant_scope,
        invocation_id=str(invocation_id),
    )
    if blob is None:
        raise ProblemError(404, "no such attachment", code="not_found")
    return Response(
        content=blob.data,
        media_type=blob.content_type,
        headers={"Cache-Control": "private, max-age=3600"},
    )


@router.post(
    "/{invocation_id}/cancel", response_model=CancelResult, responses=problem_responses(404, 503)
)
async def cancel(
    invocation_id: UUID, caller: CallerDep, res: ResourcesDep, body: ControlBodyDep = None
) -> CancelResult:
    """Ask for a running or pending invocation to be cancelled."""
    view = await _visible(res, caller, invocation_id)
    if view.status.is_terminal:
        return CancelResult(
            invocation_id=str(invocation_id),
            cancelled=False,
            message=f"invocation already finished with status {view.status.value}",
        )
    async with _publishing():
        await res.client.cancel(
            str(invocation_id),
            tenant_id=view.tenant_id,
            requested_by=caller.subject,
            reason=body.reason if body else "",
        )
    return CancelResult(
        invocation_id=str(invocation_id), cancelled=True, message="cancellation requested"
    )


async def _decide(
    res: ApiResources,
    caller: Caller,
    invocation_id: UUID,
    body: ControlBody | None,
    *,
    approve: bool,
) -> DecisionResult:
    view = await _visible(res, caller, invocation_id)
    if view.status is not InvocationStatus.PENDING_APPROVAL:
        raise ProblemError(
            409,
            f"invocation is {view.status.value}, not pending_approval",
            code=ErrorCode.STATE_CONFLICT,
        )
    async with _publishing():
        if approve:
            await res.client.approve(
                str(invocation_id),
                tenant_id=view.tenant_id,
                approver=caller.subject,
                reason=body.reason if body else "",
                parameters_hash=body.parameters_hash if body else None,
            )
        else:
            await res.client.deny(
                str(invocation_id),
                tenant_id=view.tenant_id,
                approver=caller.subject,
                reason=body.reason if body else "",
            )
    decision = "approved" if approve else "denied"
    return DecisionResult(
        invocation_id=str(invocation_id),
        decision=decision,
        message=f"invocation {decision}; the decision is on its way to policy",
    )


@router.post(
    "/{invocation_id}/approve",
    response_model=DecisionResult,
    responses=problem_responses(404, 409, 503),
)
async def approve(
    invocation_id: UUID, caller: CallerDep, res: ResourcesDep, body: ControlBodyDep = None
) -> DecisionResult:
    """Approve an invocation waiting in ``pending_approval``."""
    return await _decide(res, caller, invocation_id, body, approve=True)


@router.post(
    "/{invocation_id}/deny",
    response_model=DecisionResult,
    responses=problem_responses(404, 409, 503),
)
async def deny(
    invocation_id: UUID, caller: CallerDep, res: ResourcesDep, body: ControlBodyDep = None
) -> DecisionResult:
    """Deny an invocation waiting in ``pending_approval``."""
    return await _decide(res, caller, invocation_id, body, approve=False)
