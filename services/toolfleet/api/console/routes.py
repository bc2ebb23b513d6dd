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
from typing import Annotated, Final
from uuid import UUID

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse, Response
from pydantic import BaseModel, ConfigDict
from redis.exceptions import RedisError

import toolfleet
from toolfleet.api import invoking
from toolfleet.api.auth import CallerDep
from toolfleet.api.console.timeline import Timeline, TimelineMark, timeline
from toolfleet.api.problems import ProblemError, problem_responses
from toolfleet.api.resources import ApiResources, resources
from toolfleet.api.responses import SafeJSONResponse
from toolfleet.errors import ErrorCode

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

page_router = APIRouter(prefix="/console", include_in_schema=False)
router = APIRouter(prefix="/v1", tags=["console"], responses=problem_responses(401))


def _package_text(*parts: str) -> str:
    return package_files.files("toolfleet.api.console").joinpath(*parts).read_text("utf-8")


@page_router.get("", response_class=HTMLResponse)
async def console_page() -> HTMLResponse:
    """The console: sign-in, live invocations, timeline, approvals, circuits, tools, charts."""
    html = Template(_package_text("templates", "console.html")).substitute(
        version=toolfleet.__version__
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


@router.get("/circuits", response_model=list[Circuit], responses=problem_responses(503))
async def circuits(caller: CallerDep, res: ResourcesDep) -> list[Circuit]:
    """Every circuit breaker with a shared state, and that state (by name)."""
    found: list[Circuit] = []
    try:
        async for key in res.redis.scan_iter(match=f"{CIRCUIT_PREFIX}*", count=200):
            name = (key.decode() if isinstance(key, bytes) else str(key))[len(CIRCUIT_PREFIX) :]
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
