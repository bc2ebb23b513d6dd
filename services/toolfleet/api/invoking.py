"""Submitting, reading and cancelling invocations: one code path for every API door.

``POST /v1/invocations`` and MCP's ``tools/call`` publish through :func:`publish`, the
cancel route and MCP's client cancel go through :func:`cancel`, so validation, tenancy
and the signed control path are the same whichever door a call came in by. Failures are
:class:`~toolfleet.api.problems.ProblemError`: each door renders them its own way.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from uuid import UUID

from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from toolfleet.api.appearing import AppearWait, first_view, waking
from toolfleet.api.auth import Caller
from toolfleet.api.problems import ProblemError
from toolfleet.api.resources import ApiResources
from toolfleet.contract.http import CancelResult, InvocationView
from toolfleet.errors import ErrorCode
from toolfleet.events.identity import CallKey, traceparent_in
from toolfleet.events.models import InvokeRequested

log = logging.getLogger(__name__)

APPEAR = AppearWait()
"""The wait of a read right after the ``202`` (routes may pass a shorter one in tests)."""


@asynccontextmanager
async def publishing() -> AsyncIterator[None]:
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


def require_signing(res: ApiResources) -> None:
    """Control events this API cannot sign would be refused by policy: say so now."""
    if not res.client.signs_control:
        raise ProblemError(
            503,
            "control decisions cannot be signed: TOOLFLEET_GRANT_KEY_FILE is not set",
            code=ErrorCode.INTERNAL_ERROR,
        )


async def visible(
    res: ApiResources, caller: Caller, invocation_id: UUID, *, wait: AppearWait = APPEAR
) -> InvocationView:
    """The invocation if this caller may see it; otherwise 404, as if it did not exist.

    A call this API accepted for the caller's tenant but not yet in the status
    projection is awaited (up to ``wait.wait_s``, woken by the projection's
    notification), so a read right after the ``202`` finds it. Any other id the caller
    cannot see (unknown, another tenant's) is a 404 at once.
    """
    scope = caller.tenant_scope

    async def read() -> InvocationView | None:
        return await res.invocations.get(invocation_id, tenant_id=scope)

    with waking(res.feed, invocation_id) as pause:
        view = await read()
        if view is None and await res.accepted.was_accepted(str(invocation_id), tenant_id=scope):
            view = await first_view(
                read, wait_s=wait.wait_s, fallback_s=wait.fallback_s, pause=pause, read_first=False
            )
    if view is None:
        raise ProblemError(404, "no such invocation", code="not_found")
    return view


async def publish(
    res: ApiResources, caller: Caller, request: InvokeRequested, *, traceparent: str | None
) -> str:
    """Publish ``request`` on the caller's behalf; its invocation id.

    The request's tenant must be the token's (admins may name any); without a
    ``capability_token`` the bearer token is the capability. The call is noted as
    accepted (:mod:`toolfleet.storage.accepted`) before the answer, so the caller's
    reads of it wait for the status projection instead of answering 404.
    """
    if not caller.may_see(request.agent_context.tenant_id):
        raise ProblemError(
            403,
            "agent_context.tenant_id does not match the token's tenant",
            code=ErrorCode.PERMISSION_DENIED,
        )
    if request.capability_token is None:
        request = request.model_copy(update={"capability_token": caller.token})
    async with publishing():
        handle = await res.client.publish(request, traceparent=traceparent)
    call = CallKey(tenant_id=handle.tenant_id, invocation_id=handle.invocation_id)
    try:
        await res.accepted.accept(call)
    except RedisError as exc:
        # Published already: answer the 202 (a retry would publish it twice); reads of
        # it answer 404 until the projection has it, as without the note.
        log.warning("could not note an accepted call", extra={"error": type(exc).__name__})
    return handle.invocation_id


async def cancel(
    res: ApiResources, caller: Caller, invocation_id: UUID, *, reason: str = ""
) -> CancelResult:
    """Ask for a running or pending invocation of the caller's tenant to be cancelled.

    The cancel is signed, so policy can tell it from one written straight to the
    control topic; a finished invocation is left alone (``cancelled`` false).
    """
    view = await visible(res, caller, invocation_id)
    if view.status.is_terminal:
        return CancelResult(
            invocation_id=str(invocation_id),
            cancelled=False,
            message=f"invocation already finished with status {view.status.value}",
        )
    require_signing(res)
    async with publishing():
        await res.client.cancel(
            str(invocation_id),
            tenant_id=view.tenant_id,
            requested_by=caller.subject,
            reason=reason,
            traceparent=traceparent_in(view.trace_id),
        )
    return CancelResult(
        invocation_id=str(invocation_id), cancelled=True, message="cancellation requested"
    )
