"""The console's page and the JSON routes it reads beside the status API.

``GET /console`` is plain server-rendered HTML with one script and one stylesheet
(package data, no build step), served under a strict Content-Security-Policy: no inline
script or style, nothing from another origin. The page holds no data: the script signs
in with a token kept in ``sessionStorage`` and sends it as a bearer header to the API's
routes, the live feed (``GET /v1/events/invocations``) included.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from importlib import resources as package_files
from string import Template
from typing import Annotated, Any, Final
from uuid import UUID

from fastapi import APIRouter, Depends, Query
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, ConfigDict
from redis.exceptions import RedisError

import toolfleet
from toolfleet.api import invoking
from toolfleet.api.auth import CallerDep
from toolfleet.api.console.timeline import Timeline, TimelineMark, timeline
from toolfleet.api.problems import ProblemError, problem_responses
from toolfleet.api.queries import Cursor, InvalidCursor, InvocationFilter, prefix_range
from toolfleet.api.resources import ApiResources, resources
from toolfleet.api.responses import SafeJSONResponse
from toolfleet.contract.http import InvocationPage, InvocationView
from toolfleet.errors import ErrorCode
from toolfleet.events.models import TOOL_ID_PATTERN, InvocationStatus

ResourcesDep = Annotated[ApiResources, Depends(resources)]

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""Only this origin's script, styles and API; no inline code, no frames."""

_HEADERS: Final = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
_STATIC: Final = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
CIRCUIT_PREFIX: Final = "circuit:state:"
"""Redis keys of the circuit breakers' shared state (contract section 5)."""
MAX_CIRCUITS: Final = 500
MAX_PAGE_SIZE: Final = 200
_FAVICON: Final = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    '<rect width="16" height="16" rx="3" fill="#1f6feb"/>'
    '<path d="M4 4h8v2H9v6H7V6H4z" fill="#fff"/></svg>'
)

page_router = APIRouter(prefix="/console", include_in_schema=False)
router = APIRouter(prefix="/v1", tags=["console"], responses=problem_responses(401))


def _package_text(*parts: str) -> str:
    return package_files.files("toolfleet.api.console").joinpath(*parts).read_text("utf-8")


@page_router.get("", response_class=HTMLResponse)
async def console_page() -> HTMLResponse:
    """The console: sign-in, live invocations, timeline, approvals, circuits, tools, charts."""
    return _page(
        "console.html",
        title="toolfleet console",
        heading='toolfleet <span class="muted">console</span>',
        sign_in_note="Paste a token (<code>toolfleet token issue ...</code>). It stays in this "
        "tab (session storage) and is sent only as a bearer header. An <code>approver</code> "
        "or <code>admin</code> token can approve and deny pending calls.",
    )


@page_router.get("/invocations/{invocation_id}", response_class=HTMLResponse)
async def call_page(invocation_id: UUID) -> HTMLResponse:
    """One call's page. Like the console it holds no data: the script reads the call
    with the signed-in token (another tenant's id reads as a missing one)."""
    return _page(
        "invocation.html",
        invocation_id=str(invocation_id),
        title=f"toolfleet call {invocation_id}",
        body_attributes=f' data-page="invocation" data-invocation="{invocation_id}"',
        heading='<a href="/console" class="home">toolfleet</a> <span class="muted">call</span>',
        sign_in_note="Paste a token. It stays in this tab (session storage) and is sent only "
        "as a bearer header.",
    )


def _page(main: str, *, body_attributes: str = "", **values: str) -> HTMLResponse:
    """A console page: the shell every page shares (head, header, sign-in, footer) around
    its own ``main`` template. Values are the pages' own text (a UUID at most), never a
    caller's input."""
    values = {"version": toolfleet.__version__, **values}
    inner = Template(_package_text("templates", main)).substitute(values)
    html = Template(_package_text("templates", "page.html")).substitute(
        values, main=inner, body_attributes=body_attributes
    )
    return HTMLResponse(html, headers={**_HEADERS, "Cache-Control": "no-store"})


@page_router.get("/static/{name}")
async def console_static(name: str) -> Response:
    """The console's script and stylesheet."""
    media_type = _STATIC.get(name)
    if media_type is None:
        raise ProblemError(404, "no such file", code="not_found")
    return Response(
        _package_text("static", name),
        media_type=media_type,
        headers={**_HEADERS, "Cache-Control": "public, max-age=300"},
    )


@page_router.get("/favicon.svg")
async def console_favicon() -> Response:
    """The console's icon (the page links it, so browsers ask for no ``/favicon.ico``)."""
    return Response(
        _FAVICON,
        media_type="image/svg+xml",
        headers={**_HEADERS, "Cache-Control": "public, max-age=86400"},
    )


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Me(_Body):
    """``GET /v1/me``: who the token says the caller is, and what the console unlocks."""

    tenant_id: str
    subject: str
    scopes: list[str]
    admin: bool
    may_decide: bool
    """Whether the caller may approve or deny its tenant's pending calls."""


class Circuit(_Body):
    circuit_name: str
    state: str
    """``closed``, ``open`` or ``half_open``."""
    since: datetime | None
    """When the circuit entered ``state``."""


@router.get("/me", response_model=Me)
async def me(caller: CallerDep) -> Me:
    """The verified caller: tenant, subject, scopes."""
    return Me(
        tenant_id=caller.tenant_id,
        subject=caller.subject,
        scopes=sorted(caller.capability.scopes),
        admin=caller.is_admin,
        may_decide=caller.may_decide(caller.tenant_id),
    )


@router.get(
    "/console/invocations",
    response_model=InvocationPage,
    response_class=SafeJSONResponse,
    responses=problem_responses(422),
)
async def console_invocations(
    caller: CallerDep,
    res: ResourcesDep,
    status: InvocationStatus | None = None,
    tool_id: Annotated[str | None, Query(pattern=TOOL_ID_PATTERN, max_length=256)] = None,
    agent: Annotated[str | None, Query(min_length=1, max_length=512)] = None,
    since: datetime | None = None,
    until: datetime | None = None,
    invocation_id: Annotated[str | None, Query(min_length=8, max_length=36)] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_SIZE)] = 50,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> InvocationPage:
    """The console's list: the caller's tenant's calls, newest first, filtered by status,
    tool, agent, creation time (``since`` inclusive, ``until`` exclusive) and id or id
    prefix (at least 8 hex digits, the short id the list shows), paged by keyset
    (``cursor`` from the previous page's ``next_cursor``)."""
    try:
        after = Cursor.decode(cursor) if cursor else None
    except InvalidCursor as exc:
        raise ProblemError(422, str(exc), code=ErrorCode.INVALID_PARAMETERS) from None
    for instant in (since, until):
        if instant is not None and instant.tzinfo is None:
            raise ProblemError(
                422, "since and until need a UTC offset", code=ErrorCode.INVALID_PARAMETERS
            )
    id_range: tuple[UUID, UUID] | None = None
    if invocation_id is not None:
        try:
            id_range = prefix_range(invocation_id)
        except ValueError as exc:
            raise ProblemError(422, str(exc), code=ErrorCode.INVALID_PARAMETERS) from None
    return await res.invocations.page(
        InvocationFilter(
            tenant_id=caller.tenant_scope,
            status=status,
            tool_id=tool_id,
            agent_did=agent,
            created_from=since,
            created_to=until,
            id_range=id_range,
            limit=limit,
            after=after,
        )
    )


class ConsoleCall(_Body):
    """``GET /v1/console/invocations/{id}``: the call, with its masked parameters."""

    invocation: InvocationView
    parameters: dict[str, Any] | None
    """The parameters as the status projection stores them: secrets masked."""
    parameters_hash: str | None


_PARAMETERS = """SELECT parameters, parameters_hash FROM tool_invocations
                 WHERE tenant_id = $1 AND invocation_id = $2"""


@router.get(
    "/console/invocations/{invocation_id}",
    response_model=ConsoleCall,
    response_class=SafeJSONResponse,
    responses=problem_responses(404),
)
async def console_call(invocation_id: UUID, caller: CallerDep, res: ResourcesDep) -> ConsoleCall:
    """One call for its console page (same visibility as the status route: another
    tenant's id is the same 404 as a missing one)."""
    view = await invoking.visible(res, caller, invocation_id)
    row = await res.pool.fetchrow(_PARAMETERS, view.tenant_id, invocation_id)
    raw = None if row is None else row["parameters"]
    if isinstance(raw, str):
        raw = json.loads(raw)
    return ConsoleCall(
        invocation=view,
        parameters=raw if isinstance(raw, dict) else None,
        parameters_hash=None if row is None else row["parameters_hash"],
    )


_MARKS = """SELECT source, event_kind, occurred_at, detail FROM projected_events
            WHERE invocation_id = $1 AND tenant_id = $2 AND event_kind IS NOT NULL"""


@router.get(
    "/invocations/{invocation_id}/timeline",
    response_model=Timeline,
    response_class=SafeJSONResponse,
    responses=problem_responses(404),
)
async def invocation_timeline(
    invocation_id: UUID, caller: CallerDep, res: ResourcesDep
) -> Timeline:
    """Requested → authorized → invoked → checkpoints → outcome, with durations,
    attempts, resumes and worker hand-overs (same visibility as the status route)."""
    view = await invoking.visible(res, caller, invocation_id)
    rows = await res.pool.fetch(_MARKS, invocation_id, view.tenant_id)
    marks = [
        TimelineMark(
            kind=r["event_kind"],
            at=r["occurred_at"],
            source=r["source"],
            detail=r["detail"] if isinstance(r["detail"], dict) else {},
        )
        for r in rows
        if r["occurred_at"] is not None
    ]
    return timeline(view, marks)


_TENANT_CIRCUITS = """SELECT DISTINCT tool_id AS name FROM tool_invocations WHERE tenant_id = $1
    UNION SELECT DISTINCT error->'details'->>'circuit' FROM tool_invocations
    WHERE tenant_id = $1 AND error->'details'->>'circuit' IS NOT NULL"""
"""A circuit is named after its tool, or shared under a name refusals carry."""


@router.get("/circuits", response_model=list[Circuit], responses=problem_responses(503))
async def circuits(caller: CallerDep, res: ResourcesDep) -> list[Circuit]:
    """The circuit breakers with a shared state, and that state (by name): for a tenant,
    only the circuits of tools it has called; for an admin, every one."""
    scope: set[str] | None = None
    if caller.tenant_scope is not None:
        rows = await res.pool.fetch(_TENANT_CIRCUITS, caller.tenant_scope)
        scope = {str(r["name"]) for r in rows if r["name"]}
    found: list[Circuit] = []
    try:
        async for key in res.redis.scan_iter(match=f"{CIRCUIT_PREFIX}*", count=200):
            name = (key.decode() if isinstance(key, bytes) else str(key))[len(CIRCUIT_PREFIX) :]
            if scope is not None and name not in scope:
                continue
            raw = await res.redis.get(key)
            found.append(_circuit(name, raw))
            if len(found) >= MAX_CIRCUITS:
                break
    except (RedisError, OSError):
        raise ProblemError(
            503, "circuit states are unavailable; retry later", code=ErrorCode.INTERNAL_ERROR
        ) from None
    return sorted(found, key=lambda c: c.circuit_name)


def _circuit(name: str, raw: bytes | str | None) -> Circuit:
    try:
        data = json.loads(raw or "{}")
        state = str(data.get("status", "closed"))
        since = float(data.get("since") or 0)
    except (ValueError, TypeError, AttributeError):
        return Circuit(circuit_name=name, state="unknown", since=None)
    return Circuit(
        circuit_name=name,
        state=state,
        since=datetime.fromtimestamp(since, UTC) if since > 0 else None,
    )
