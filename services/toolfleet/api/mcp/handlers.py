"""The MCP handlers: toolfleet's own code paths behind ``tools/list`` and ``tools/call``.

``tools/list`` is the caller's catalog (as ``GET /v1/tools``: its tenant's policy and
its token's ``tool_id`` claim); ``tools/call`` publishes as ``POST /v1/invocations`` does
and follows the invocation through the status projection, no longer than the caller's
token lives (revoked or expired, the call answers why at once); a client cancel goes
through the signed cancel of ``POST /v1/invocations/{id}/cancel``. Each handler finds
the caller the door (:class:`~toolfleet.api.mcp.endpoint.McpEndpoint`) verified in the
request's scope.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Final
from uuid import UUID

import anyio
import asyncpg
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError
from redis.exceptions import RedisError
from starlette.requests import Request

from toolfleet.api import invoking
from toolfleet.api.auth import Caller
from toolfleet.api.catalog import catalog_view
from toolfleet.api.credential import CloseReason, CredentialWatch, before_credential_ends
from toolfleet.api.mcp.calls import CallIndex, FollowInput, call_key, follow
from toolfleet.api.mcp.results import (
    credential_result,
    error_result,
    finished_result,
    handle_result,
    mcp_tool,
    problem_result,
)
from toolfleet.api.problems import ProblemError
from toolfleet.api.resources import ApiResources
from toolfleet.contract.http import InvocationView
from toolfleet.contract.manifest import LifecycleState, ToolManifest
from toolfleet.errors import ErrorCode
from toolfleet.events.models import (
    AgentContext,
    ExecutionOptions,
    InvocationStatus,
    InvokeRequested,
)
from toolfleet.policy.catalog import visible_page
from toolfleet.storage.retrying import Backoff, retry_until_stopped

log = logging.getLogger(__name__)

PAGE_SIZE: Final = 100
"""Tools per ``tools/list`` page."""
IDEMPOTENCY_META_KEY: Final = "io.toolfleet/idempotency_key"
"""``_meta`` key of a ``tools/call`` that carries the request's idempotency key."""
INVOCATION_META_KEY: Final = "io.toolfleet/invocation_id"
"""``_meta`` key naming the invocation in the result of every call that was published."""
SCOPE_KEY: Final = "toolfleet.mcp"
"""ASGI scope key under which the door leaves the :class:`McpRequest`."""
_CANCEL_REASON: Final = "cancelled by the MCP client"
_UNSEEN_RETRIES_S: Final = (0.1, 0.2, 0.4, 0.8)
_STORE_ERRORS: Final = (asyncpg.PostgresError, RedisError, OSError)
"""Outages of Postgres or Redis while serving a request."""
_CANCEL_WITHIN_S: Final = 10.0
"""Bound on a shielded cancel (Redis read, publish, retries while status catches up)."""

Context = ServerRequestContext[Any, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class McpRequest:
    """What the door learnt about one HTTP request, for the handlers it reaches."""

    res: ApiResources
    caller: Caller
    calls: CallIndex
    traceparent: str | None = None


def _seen(ctx: Context) -> McpRequest:
    request = ctx.request
    seen = request.scope.get(SCOPE_KEY) if isinstance(request, Request) else None
    if not isinstance(seen, McpRequest):  # pragma: no cover - only McpEndpoint serves
        raise MCPError(code=types.INTERNAL_ERROR, message="request did not pass the door")
    return seen


async def list_tools(
    ctx: Context, params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    """The caller's allowed catalog, one page per call (cursor: the next offset)."""
    seen = _seen(ctx)
    offset = _offset(params.cursor if params is not None else None)

    async def fetch(limit: int, start: int) -> tuple[list[dict[str, Any]], int]:
        return await seen.res.registry.list_tools(limit=limit, offset=start)

    tools = []
    try:
        view = await catalog_view(seen.res, seen.caller)
        rows, total = await visible_page(view, fetch, offset=offset, limit=PAGE_SIZE)
        for row in rows:
            manifest = _current(await seen.res.registry.versions(str(row["tool_id"])))
            if manifest is not None:
                tools.append(mcp_tool(manifest))
    except _STORE_ERRORS as exc:
        # The type only: a driver's message may carry data; the SDK would send it on.
        log.warning("MCP tools/list failed", extra={"error": type(exc).__name__})
        raise MCPError(
            code=types.INTERNAL_ERROR, message="the tool registry is unavailable; retry later"
        ) from None
    more = offset + PAGE_SIZE < total
    return types.ListToolsResult(tools=tools, next_cursor=str(offset + PAGE_SIZE) if more else None)


def _offset(cursor: str | None) -> int:
    if cursor is None:
        return 0
    if not cursor.isdigit() or len(cursor) > 9:
        raise MCPError(code=types.INVALID_PARAMS, message="cursor is not one this server returned")
    return int(cursor)


def _current(versions: list[ToolManifest]) -> ToolManifest | None:
    """The version a ``*`` request resolves to: newest active, else newest deprecated."""
    for state in (LifecycleState.ACTIVE, LifecycleState.DEPRECATED):
        for manifest in versions:  # newest first
            if manifest.lifecycle_state is state:
                return manifest
    return None


async def call_tool(ctx: Context, params: types.CallToolRequestParams) -> types.CallToolResult:
    """Publish the call as ``POST /v1/invocations`` does; answer with its outcome."""
    seen = _seen(ctx)
    res, caller = seen.res, seen.caller
    try:
        request = InvokeRequested(
            tool_id=params.name,
            agent_context=AgentContext(
                agent_did=caller.capability.agent_did, tenant_id=caller.tenant_id
            ),
            parameters=params.arguments or {},
            execution_options=ExecutionOptions(idempotency_key=_idempotency_key(params)),
        )
    except ValidationError as exc:
        return error_result(ErrorCode.INVALID_PARAMETERS, _validation_message(exc))
    try:
        invocation_id = await invoking.publish(res, caller, request, traceparent=seen.traceparent)
    except ProblemError as exc:
        return problem_result(exc)
    wait_s = res.settings.mcp_call_wait_s
    if ctx.request_id is not None:
        with contextlib.suppress(RedisError, OSError):  # only handshake-era cancels need it
            key = call_key(caller.capability.jti, ctx.request_id)
            await seen.calls.remember(key, UUID(invocation_id), ttl_s=wait_s + 60)

    async def read() -> InvocationView | None:
        return await res.invocations.get(UUID(invocation_id), tenant_id=caller.tenant_scope)

    async def on_progress(view: InvocationView) -> None:
        await ctx.session.report_progress(view.progress_percent, 100.0, view.current_phase or None)

    following = follow(
        FollowInput(invocation_id=invocation_id, wait_s=wait_s), read, res.notices, on_progress
    )
    watch = CredentialWatch(revocations=res.revocations)
    try:
        followed = await before_credential_ends(following, watch.ended(caller.capability))
    except asyncio.CancelledError:
        # The client closed the response stream (how a 2026 client cancels).
        with anyio.move_on_after(_CANCEL_WITHIN_S, shield=True):
            await _cancel(seen, UUID(invocation_id))
        raise
    except _STORE_ERRORS as exc:
        log.warning("MCP tools/call lost its status", extra={"error": type(exc).__name__})
        followed, lost = None, True
    else:
        lost = False
    status_url = f"{res.settings.api_url.rstrip('/')}/v1/invocations/{invocation_id}"
    view = None if isinstance(followed, CloseReason) else followed
    if isinstance(followed, CloseReason):
        # The token ended while the call ran: say so, and answer nothing more to it.
        answer = credential_result(invocation_id, followed)
    elif lost:
        answer = error_result(
            ErrorCode.INTERNAL_ERROR,
            f"the call was submitted but its status is unavailable; poll {status_url}",
        )
    elif view is None:
        answer = handle_result(invocation_id, InvocationStatus.PENDING, status_url=status_url)
    elif view.status.is_terminal:
        answer = finished_result(view)
    else:
        answer = handle_result(invocation_id, view.status, status_url=status_url)
    return answer.model_copy(update={"meta": {INVOCATION_META_KEY: invocation_id}})


async def on_cancelled(ctx: Context, params: types.CancelledNotificationParams) -> None:
    """A handshake-era client's cancel: find the invocation its request started, cancel it."""
    if params.request_id is None:
        return
    seen = _seen(ctx)
    key = call_key(seen.caller.capability.jti, params.request_id)
    # The transport is torn down as soon as it has answered the notification's POST
    # with 202, which cancels this handler: shield the cancel, within a bound.
    with anyio.move_on_after(_CANCEL_WITHIN_S, shield=True):
        try:
            invocation_id = await seen.calls.recall(key)
        except (RedisError, OSError) as exc:
            log.warning("MCP cancel not applied", extra={"error": type(exc).__name__})
            return
        if invocation_id is not None:
            await _cancel(seen, invocation_id)


async def _cancel(seen: McpRequest, invocation_id: UUID) -> None:
    """The API's signed cancel; a failure is logged (the client has gone already)."""
    try:
        await retry_until_stopped(
            lambda: invoking.cancel(seen.res, seen.caller, invocation_id, reason=_CANCEL_REASON),
            what="MCP cancel: invocation not projected yet; retrying",
            backoff=Backoff.listed(_UNSEEN_RETRIES_S),
            # Status projects a call milliseconds after its publish: a client that cancels
            # at once may be faster than that. Any other answer is final.
            retry_on=lambda exc: isinstance(exc, ProblemError) and exc.status == 404,
            tries=len(_UNSEEN_RETRIES_S) + 1,
            log_extra={"invocation_id": str(invocation_id)},
        )
        return
    except ProblemError as exc:
        failure = f"{exc.status} {exc.code}"
    except _STORE_ERRORS as exc:
        failure = type(exc).__name__
    log.warning(
        "MCP cancel not applied",
        extra={"invocation_id": str(invocation_id), "error": failure},
    )


def _idempotency_key(params: types.CallToolRequestParams) -> str | None:
    meta = params.meta or {}
    key = meta.get(IDEMPOTENCY_META_KEY)
    return str(key) if key is not None else None


def _validation_message(exc: ValidationError) -> str:
    """What is wrong, field by field, without the values sent."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err.get('loc', ())) or 'request'}: {err.get('msg', 'invalid')}"
        for err in exc.errors()
    )
