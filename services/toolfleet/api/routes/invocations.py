"""``/v1/invocations``: submit, read, list, cancel and resolve approvals.

Reads come from the status projection; writes are events published through
:class:`~toolfleet.client.KafkaPublisher`, so the API holds no state of its own.
Another tenant's invocation is answered exactly like an unknown one (404). Routes that
answer with projected data use :class:`SafeJSONResponse`: parameters and results may
hold lone surrogates, which FastAPI's direct pydantic serialization refuses.
"""

from __future__ import annotations

import asyncio
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Body, Depends, Header, Query, Response

from toolfleet.api import invoking
from toolfleet.api.appearing import AppearWaitDep
from toolfleet.api.auth import Caller, CallerDep
from toolfleet.api.prefer import Preferences, parse_prefer
from toolfleet.api.problems import ProblemError, problem_responses
from toolfleet.api.queries import Cursor, InvalidCursor, InvocationFilter
from toolfleet.api.resources import ApiResources, resources
from toolfleet.api.responses import SafeJSONResponse
from toolfleet.contract.http import (
    CancelResult,
    ControlBody,
    DecisionResult,
    InvocationPage,
    InvocationView,
    InvokeAccepted,
    PollingInfo,
)
from toolfleet.errors import ErrorCode
from toolfleet.events.identity import CallKey, traceparent_in, valid_traceparent
from toolfleet.events.models import TOOL_ID_PATTERN, InvocationStatus, InvokeRequested
from toolfleet.policy.redis_stores import RedisApprovalStore
from toolfleet.storage.notices import await_finished

router = APIRouter(
    prefix="/v1/invocations", tags=["invocations"], responses=problem_responses(401, 422)
)

ResourcesDep = Annotated[ApiResources, Depends(resources)]
ControlBodyDep = Annotated[ControlBody | None, Body()]

POLL_INTERVAL_MS = 500
MAX_PAGE_SIZE = 200


@router.post(
    "",
    status_code=202,
    response_class=SafeJSONResponse,
    response_model=InvokeAccepted | InvocationView,
    responses={
        200: {
            "model": InvocationView,
            "description": "Synchronous invoke (``async_mode: false`` or ``Prefer: wait=N``): "
            "the invocation ended in time; its status with the outcome.",
        },
        202: {"model": InvokeAccepted, "description": "Accepted; poll ``status_url``."},
        **problem_responses(403, 503),
    },
)
async def submit(
    request: InvokeRequested,
    caller: CallerDep,
    res: ResourcesDep,
    response: Response,
    traceparent: Annotated[str | None, Header(include_in_schema=False)] = None,
    prefer: Annotated[
        list[str] | None,
        Header(description="RFC 7240: `wait=N` (N ≤ 60) waits up to N s for the outcome."),
    ] = None,
) -> InvokeAccepted | InvocationView:
    """Publish an invoke request; poll ``polling_info.status_url`` for its outcome.

    Without a ``capability_token`` in the body, the bearer token is the capability.
    A valid W3C ``traceparent`` header makes the invocation part of the caller's trace.

    With ``execution_options.async_mode: false`` (waits ``TOOLFLEET_SYNC_INVOKE_WAIT_S``)
    or ``Prefer: wait=N`` (waits N seconds, at most 60; answered with
    ``Preference-Applied``), the call waits for the outcome: ``200`` with the
    invocation's status if it ended in time, else ``202`` as without.
    """
    wait_s = _wait_s(request, parse_prefer(prefer or ()), res, response)
    invocation_id = await invoking.publish(
        res, caller, request, traceparent=valid_traceparent(traceparent)
    )
    if wait_s > 0:
        # Watching before the first read is enough: status notifies after it commits,
        # so an outcome stored before the watch began is found by that read.
        with res.notices.watch(invocation_id) as finished:
            view = await _outcome(res, caller, UUID(invocation_id), finished, wait_s)
        if view is not None:
            response.status_code = 200
            return view
    status_url = f"{res.settings.api_url.rstrip('/')}/v1/invocations/{invocation_id}"
    return InvokeAccepted(
        invocation_id=invocation_id,
        polling_info=PollingInfo(status_url=status_url, poll_interval_ms=POLL_INTERVAL_MS),
    )


def _wait_s(
    request: InvokeRequested, prefer: Preferences, res: ApiResources, response: Response
) -> float:
    """Seconds to wait for the outcome: ``Prefer`` first, then ``async_mode``."""
    if prefer.wait_s is not None:
        response.headers["Preference-Applied"] = f"wait={prefer.wait_s}"
        return float(prefer.wait_s)
    if prefer.respond_async:
        response.headers["Preference-Applied"] = "respond-async"
        return 0.0
    if not request.execution_options.async_mode:
        return res.settings.sync_invoke_wait_s
    return 0.0


async def _outcome(
    res: ApiResources, caller: Caller, invocation_id: UUID, finished: asyncio.Event, wait_s: float
) -> InvocationView | None:
    """The invocation once status shows it finished, or ``None`` after ``wait_s``."""

    async def finished_view() -> InvocationView | None:
        view = await res.invocations.get(invocation_id, tenant_id=caller.tenant_scope)
        return view if view is not None and view.status.is_terminal else None

    return await await_finished(
        finished_view,
        finished,
        timeout_s=wait_s,
        recheck_s=res.settings.sync_invoke_recheck_s,
    )


@router.get("", response_model=InvocationPage, response_class=SafeJSONResponse)
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


@router.get(
    "/{invocation_id}",
    response_model=InvocationView,
    response_class=SafeJSONResponse,
    responses=problem_responses(404),
)
async def get_invocation(
    invocation_id: UUID, caller: CallerDep, res: ResourcesDep, wait: AppearWaitDep
) -> InvocationView:
    """Status, progress and, once finished, the outcome of one invocation.

    The status projection trails the publish by a few milliseconds: a call this API
    accepted a moment ago is awaited (up to 5 s) until the projection has it, so a read
    right after ``POST`` finds it; an unknown id, or another tenant's, is a 404 at once.
    """
    return await invoking.visible(res, caller, invocation_id, wait=wait)


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
    """Ask for a running or pending invocation to be cancelled.

    Any token of the call's own tenant may cancel it; the API signs the cancel so that
    policy can tell it from one written straight to the control topic.
    """
    return await invoking.cancel(res, caller, invocation_id, reason=body.reason if body else "")


async def _decide(
    res: ApiResources,
    caller: Caller,
    invocation_id: UUID,
    body: ControlBody | None,
    *,
    approve: bool,
) -> DecisionResult:
    view = await invoking.visible(res, caller, invocation_id)
    if not caller.may_decide(view.tenant_id):
        raise ProblemError(
            403,
            "deciding a pending call needs a token with the approver scope for its tenant",
            code=ErrorCode.PERMISSION_DENIED,
        )
    if view.status is not InvocationStatus.PENDING_APPROVAL:
        raise ProblemError(
            409,
            f"invocation is {view.status.value}, not pending_approval",
            code=ErrorCode.STATE_CONFLICT,
        )
    # Judged on the request policy parked (the row is a projection): policy judges the
    # same again when the decision reaches it, and refuses it there too.
    call = CallKey(tenant_id=view.tenant_id, invocation_id=str(invocation_id))
    waiting = await RedisApprovalStore(res.redis).peek(call)
    if waiting is None:
        raise ProblemError(
            409, "invocation no longer waits for approval", code=ErrorCode.STATE_CONFLICT
        )
    if caller.is_requester(waiting.authorized.agent_context.agent_did) or caller.is_requester(
        waiting.authid
    ):
        raise ProblemError(
            403,
            "the requesting agent cannot decide its own call",
            code=ErrorCode.PERMISSION_DENIED,
        )
    invoking.require_signing(res)
    # Without a hash from the body, the approval binds to what GET showed the approver.
    reviewed = body.parameters_hash if body and body.parameters_hash else None
    if reviewed is None and view.approval is not None:
        reviewed = view.approval.parameters_hash
    traceparent = traceparent_in(view.trace_id)  # the decision joins the call's trace
    async with invoking.publishing():
        if approve:
            await res.client.approve(
                str(invocation_id),
                tenant_id=view.tenant_id,
                approver=caller.subject,
                reason=body.reason if body else "",
                parameters_hash=reviewed,
                traceparent=traceparent,
            )
        else:
            await res.client.deny(
                str(invocation_id),
                tenant_id=view.tenant_id,
                approver=caller.subject,
                reason=body.reason if body else "",
                traceparent=traceparent,
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
    responses=problem_responses(403, 404, 409, 503),
)
async def approve(
    invocation_id: UUID, caller: CallerDep, res: ResourcesDep, body: ControlBodyDep = None
) -> DecisionResult:
    """Approve an invocation waiting in ``pending_approval``.

    Needs the ``approver`` (or ``admin``) scope for the call's tenant, and the approver
    must not be the requesting agent (``403`` otherwise). The approval binds to the
    body's ``parameters_hash`` or else to the one ``GET`` shows; the API signs it.
    """
    return await _decide(res, caller, invocation_id, body, approve=True)


@router.post(
    "/{invocation_id}/deny",
    response_model=DecisionResult,
    responses=problem_responses(403, 404, 409, 503),
)
async def deny(
    invocation_id: UUID, caller: CallerDep, res: ResourcesDep, body: ControlBodyDep = None
) -> DecisionResult:
    """Deny an invocation waiting in ``pending_approval`` (same rules as approve)."""
    return await _decide(res, caller, invocation_id, body, approve=False)
