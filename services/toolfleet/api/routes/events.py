"""Server-Sent Events: one invocation's life, and the live list of a tenant's invocations.

``GET /v1/invocations/{id}/events`` follows one invocation.

For UIs that show an agent's tool calls as they run. The stream follows the status
projection and speaks the agent runner's event names: ``tool_call_start`` (first, with
the current status), ``approval_pending``, ``progress`` (each new checkpoint of the
tool, with its progress and phase) and ``tool_call_result`` (the outcome), after
which it ends. Same visibility as ``GET /v1/invocations/{id}``: another tenant's
invocation is a 404. An invocation just accepted (``202``) may not be in the status
projection yet, so an id the caller cannot see is awaited (:mod:`toolfleet.api.appearing`,
up to five seconds, woken by the projection's notifications) before the 404: a caller
following its own call right after submitting it gets the stream, never a 404. Unlike
``GET /v1/invocations/{id}``, which waits only for a call the API accepted, the stream
waits for any id, so a call published straight to Kafka can be followed from its first
moment; the wait is the same for a missing id and for another tenant's, so the two
answers stay indistinguishable.

``GET /v1/events/invocations`` is the console's live list: a ``snapshot`` of the newest
invocations the caller may see, then one ``invocation`` event per change, pushed by the
projection's notifications (:mod:`toolfleet.api.feed`), without polling. A
``snapshot`` again means "replace the list" (after the feed may have missed changes).
Results are left out; ``GET /v1/invocations/{id}`` has them.

Both streams end with the token that opened them: within a second of its revocation,
or at its ``exp``, the last event is ``stream_closed`` with ``reason`` ``token_revoked``
or ``token_expired`` (:mod:`toolfleet.api.credential`), and the stream closes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends
from fastapi.responses import StreamingResponse

from toolfleet.api.appearing import AppearWaitDep, appeared
from toolfleet.api.auth import CallerDep
from toolfleet.api.credential import CredentialWatch, until_credential_ends
from toolfleet.api.feed import RESYNC, Subscription
from toolfleet.api.problems import ProblemError, problem_responses
from toolfleet.api.queries import InvocationFilter
from toolfleet.api.resources import ApiResources, resources
from toolfleet.api.responses import EVENT_STREAM, KEEPALIVE, KEEPALIVE_S, sse_frame
from toolfleet.contract.http import InvocationView
from toolfleet.contract.progress import EventKind, view_events

router = APIRouter(
    prefix="/v1/invocations", tags=["invocations"], responses=problem_responses(401, 422)
)
feed_router = APIRouter(prefix="/v1/events", tags=["invocations"], responses=problem_responses(401))

ResourcesDep = Annotated[ApiResources, Depends(resources)]

POLL_S = 0.2
"""How often the projection is read while the invocation runs."""


def frames(
    before: InvocationView | None, now: InvocationView
) -> list[tuple[EventKind, dict[str, Any]]]:
    """The events that the change from ``before`` to ``now`` means (pure)."""
    data = {
        "invocation_id": str(now.invocation_id),
        "tool_id": now.tool_id,
        "tool_version": now.tool_version,
        "status": now.status.value,
        "progress_percent": now.progress_percent,
        "current_phase": now.current_phase,
    }
    found: list[tuple[EventKind, dict[str, Any]]] = []
    for kind in view_events(before, now):
        if kind is EventKind.TOOL_CALL_RESULT:
            result = {
                **data,
                "result": now.result,
                "error": now.error,
                "execution_metadata": now.execution_metadata,
            }
            found.append((kind, result))
        else:
            found.append((kind, data))
    return found


def _frame(number: int, kind: EventKind | str, data: dict[str, Any]) -> str:
    body = json.dumps(data, separators=(",", ":"), default=str)
    return sse_frame(number, kind.value if isinstance(kind, EventKind) else kind, body)


async def follow(
    read: Callable[[], Awaitable[InvocationView | None]],
    first: InvocationView,
    *,
    pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> AsyncIterator[str]:
    """SSE frames from ``first`` until the invocation is terminal (or disappears)."""
    before: InvocationView | None = None
    now: InvocationView | None = first
    number = 0
    idle = 0.0
    while now is not None:
        for kind, data in frames(before, now):
            number += 1
            idle = 0.0
            yield _frame(number, kind, data)
        if now.status.is_terminal:
            return
        await pause(POLL_S)
        idle += POLL_S
        if idle >= KEEPALIVE_S:
            idle = 0.0
            yield KEEPALIVE
        before, now = now, await read()


@router.get(
    "/{invocation_id}/events",
    response_class=StreamingResponse,
    responses={
        **problem_responses(404),
        **EVENT_STREAM,
    },
)
async def invocation_events(
    invocation_id: UUID, caller: CallerDep, res: ResourcesDep, wait: AppearWaitDep
) -> StreamingResponse:
    """Follow one invocation: ``tool_call_start``, ``approval_pending``, ``progress``,
    then ``tool_call_result`` with the outcome, as Server-Sent Events. If the token is
    revoked or expires first, the last event is ``stream_closed`` with its ``reason``.
    A call accepted a moment ago is awaited (up to 5 s) until the status projection
    has it, so following one's own call right after submitting it never answers 404."""
    scope = caller.tenant_scope

    async def read() -> InvocationView | None:
        return await res.invocations.get(invocation_id, tenant_id=scope)

    first = await appeared(res.feed, read, invocation_id, wait=wait)
    if first is None:
        raise ProblemError(404, "no such invocation", code="not_found")
    watch = CredentialWatch(revocations=res.revocations)
    return StreamingResponse(
        until_credential_ends(follow(read, first), lambda: watch.ended(caller.capability)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


SNAPSHOT_SIZE = 100
"""Invocations in the list's first (and every resync) ``snapshot``."""
_LEFT_OUT = frozenset({"result", "execution_metadata", "latest_checkpoint"})


def summary(view: InvocationView) -> dict[str, Any]:
    """An invocation as the live list shows it: no result (pending parameters stay)."""
    return view.model_dump(mode="json", exclude=set(_LEFT_OUT))


async def follow_list(
    subscription: Subscription,
    snapshot: Callable[[], Awaitable[list[InvocationView]]],
    *,
    keepalive_s: float = KEEPALIVE_S,
) -> AsyncIterator[str]:
    """SSE frames: a snapshot, then each change (a resync sends a fresh snapshot)."""
    number = 1
    yield _frame(number, "snapshot", {"items": [summary(v) for v in await snapshot()]})
    while True:
        try:
            item = await asyncio.wait_for(subscription.queue.get(), keepalive_s)
        except TimeoutError:
            yield KEEPALIVE
            continue
        number += 1
        if item == RESYNC or not isinstance(item, InvocationView):
            yield _frame(number, "snapshot", {"items": [summary(v) for v in await snapshot()]})
        else:
            yield _frame(number, "invocation", summary(item))


@feed_router.get(
    "/invocations",
    response_class=StreamingResponse,
    responses=EVENT_STREAM,
)
async def invocation_list_events(caller: CallerDep, res: ResourcesDep) -> StreamingResponse:
    """The caller's tenant's invocations, live (an admin follows every tenant):
    ``snapshot`` with the newest 100, then ``invocation`` for each change, until the
    token is revoked or expires: then ``stream_closed`` with its ``reason``, and the end."""
    scope = caller.tenant_scope

    async def snapshot() -> list[InvocationView]:
        page = await res.invocations.page(InvocationFilter(tenant_id=scope, limit=SNAPSHOT_SIZE))
        return page.items

    async def frames_of_feed() -> AsyncIterator[str]:
        # Subscribed before the snapshot is read: no change falls between the two.
        with res.feed.subscribe(scope) as subscription:
            async for frame in follow_list(subscription, snapshot):
                yield frame

    watch = CredentialWatch(revocations=res.revocations)
    return StreamingResponse(
        until_credential_ends(frames_of_feed(), lambda: watch.ended(caller.capability)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
