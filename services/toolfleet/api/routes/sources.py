"""``/v1/sources``: register, list, configure and remove tool sources (admin scope only).

The API never starts or reaches a source. Adding (or replacing) a source stores it and
requests a listing of its tools; an executor lists them (starting a stdio server in its
sandbox, or reaching an MCP server over HTTP), registers each in the tool registry and
stores the answer (:mod:`toolfleet.sources.listing`). The answer is ``202`` with the
listing ``pending``; ``GET /v1/sources/{name}/listing`` shows it ``ready`` or
``failed`` with a typed error, and ``POST`` there asks for a new listing. An HTTP
source's tools are its declared operations: they are registered at once (``201``,
``ready``), nothing reached. No policy allows a source tool before it names it.
``PUT /v1/sources/{name}/tools/{tool}/rules`` sets what clients see of one tool's
results (allowlist, validation mode, sanitization, size limit), for every version;
``PUT /v1/sources/{name}/tools/{tool}/effect`` the effect an operator vouches for (a
source tool is ``external_side_effect`` until one does; its server's hints never count).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response
from pydantic import BaseModel, ConfigDict

from toolfleet.api.auth import Caller, CallerDep
from toolfleet.api.problems import ProblemError, problem_responses
from toolfleet.api.resources import ApiResources, resources
from toolfleet.errors import ErrorCode
from toolfleet.sources.declared import declared_tools, tool_id_of
from toolfleet.sources.models import (
    SOURCE_NAME_PATTERN,
    Discovery,
    ListingState,
    SourceDefinition,
    SourceKind,
    SourceListing,
    SourceTool,
)
from toolfleet.sources.rules import ToolEffectChoice, ToolRules, configured, with_effect
from toolfleet.sources.store import ListingStore, SourceStore

#: ``listed_by`` of an HTTP source's declared tools (registered where it is stored).
LISTED_BY_API = "api"

router = APIRouter(
    prefix="/v1/sources", tags=["sources"], responses=problem_responses(401, 403, 422)
)

ResourcesDep = Annotated[ApiResources, Depends(resources)]
NamePath = Annotated[str, Path(pattern=SOURCE_NAME_PATTERN, description="Source name.")]
ToolPath = Annotated[
    str,
    Path(max_length=200, description="The tool's name on the source, or its fleet tool id."),
]


class SourceView(BaseModel):
    """A source, the tools the fleet knows from it, and where their listing stands."""

    model_config = ConfigDict(extra="forbid")

    source: SourceDefinition
    tools: list[SourceTool]
    """Every version registered so far (none before the first listing is ready)."""
    listing: SourceListing | None
    """The last requested listing (none only for a source removed meanwhile)."""


class SourceList(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sources: list[SourceDefinition]
    listings: dict[str, ListingState] = {}
    """Each source's listing state, by name."""


def _require_admin(caller: Caller) -> None:
    if not caller.is_admin:
        raise ProblemError(
            403, "managing tool sources needs the admin scope", code=ErrorCode.PERMISSION_DENIED
        )


def _listing_url(name: str) -> str:
    return f"/v1/sources/{name}/listing"


@router.post(
    "",
    response_model=SourceView,
    status_code=201,
    responses={202: {"description": "Stored; an executor lists its tools (pending)."}},
)
async def add_source(
    source: SourceDefinition, res: ResourcesDep, caller: CallerDep, response: Response
) -> SourceView:
    """Store the source (replacing one of the same name) and request a listing of its
    tools: ``202`` with the listing ``pending`` (an executor lists an MCP server), or
    ``201`` with it ``ready`` (an HTTP source's declared operations, registered now)."""
    _require_admin(caller)
    store = SourceStore(res.pool)
    declared = [tool_id_of(source, op) for op in source.operations]
    taken = await store.id_conflicts(source.name, declared)
    if taken:
        owners = ", ".join(f"{t} ({owner})" for t, owner in sorted(taken.items()))
        raise ProblemError(
            409,
            f"tool ids already registered by another source or a native tool: {owners}",
            code=ErrorCode.INVALID_PARAMETERS,
            extensions={"conflicting_tools": taken},
        )
    listing = await store.put(source)
    await store.restate_rules(source.name)  # a replaced source's known versions follow it
    listing = await _list_declared(res, source, listing, via="add")
    _answer_listing(response, source.name, listing, created=True)
    return await _view(res, source, listing)


async def _view(
    res: ApiResources, source: SourceDefinition, listing: SourceListing | None = None
) -> SourceView:
    return SourceView(
        source=source,
        tools=await SourceStore(res.pool).tools(source.name),
        listing=listing or await ListingStore(res.pool).get(source.name),
    )


async def _list_declared(
    res: ApiResources, source: SourceDefinition, listing: SourceListing, *, via: Discovery
) -> SourceListing:
    """An HTTP source's listing, done here: its tools are what its definition declares."""
    if source.kind is not SourceKind.HTTP:
        return listing
    tools = declared_tools(source)
    await SourceStore(res.pool).record(tools, via=via)
    return await ListingStore(res.pool).listed_here(listing, tools=len(tools), by=LISTED_BY_API)


def _answer_listing(
    response: Response, name: str, listing: SourceListing, *, created: bool
) -> None:
    """``202`` and where to watch while an executor has yet to answer."""
    if listing.state is ListingState.PENDING:
        response.status_code = 202
        response.headers["Location"] = _listing_url(name)
    elif created:
        response.status_code = 201


@router.get("", response_model=SourceList)
async def list_sources(res: ResourcesDep, caller: CallerDep) -> SourceList:
    _require_admin(caller)
    return SourceList(
        sources=await SourceStore(res.pool).sources(),
        listings=await ListingStore(res.pool).states(),
    )


@router.get("/{name}", response_model=SourceView, responses=problem_responses(404))
async def get_source(name: NamePath, res: ResourcesDep, caller: CallerDep) -> SourceView:
    """The source, every tool version it registered, and its listing."""
    _require_admin(caller)
    store = SourceStore(res.pool)
    source = await store.get(name)
    if source is None:
        raise _no_source(name)
    return await _view(res, source)


@router.get("/{name}/listing", response_model=SourceListing, responses=problem_responses(404))
async def get_listing(name: NamePath, res: ResourcesDep, caller: CallerDep) -> SourceListing:
    """Where the source's listing stands: ``pending``, ``ready`` or ``failed`` (with a
    typed ``error``; a retryable one is tried again from ``next_attempt_at``)."""
    _require_admin(caller)
    listing = await ListingStore(res.pool).get(name)
    if listing is None:
        raise _no_source(name)
    return listing


@router.post(
    "/{name}/listing",
    response_model=SourceListing,
    status_code=200,
    responses={**problem_responses(404), 202: {"description": "Requested (pending)."}},
)
async def request_listing(
    name: NamePath, res: ResourcesDep, caller: CallerDep, response: Response
) -> SourceListing:
    """List the source's tools again (a server that changed while no session heard it,
    or a failed listing): ``202`` with the new listing ``pending``."""
    _require_admin(caller)
    source = await SourceStore(res.pool).get(name)
    listing = None if source is None else await ListingStore(res.pool).request(name)
    if source is None or listing is None:
        raise _no_source(name)
    listing = await _list_declared(res, source, listing, via="refresh")
    _answer_listing(response, name, listing, created=False)
    return listing


def _no_source(name: str) -> ProblemError:
    return ProblemError(404, f"no source {name!r}", code=ErrorCode.TOOL_NOT_FOUND)


@router.put(
    "/{name}/tools/{tool}/rules", response_model=SourceView, responses=problem_responses(404)
)
async def configure_tool(
    name: NamePath, tool: ToolPath, rules: ToolRules, res: ResourcesDep, caller: CallerDep
) -> SourceView:
    """Replace one tool's result rules; every version of it, and versions listed later,
    follow them. Validators apply them within their registry cache's lifetime (5 s)."""
    _require_admin(caller)
    store = SourceStore(res.pool)
    remote = await _remote_name(store, name, tool)
    updated = await store.update(name, lambda current: configured(current, remote, rules))
    if updated is None:
        raise _no_source(name)
    await store.restate_rules(name)
    return SourceView(
        source=updated,
        tools=await store.tools(name),
        listing=await ListingStore(res.pool).get(name),
    )


@router.put(
    "/{name}/tools/{tool}/effect", response_model=SourceView, responses=problem_responses(404)
)
async def set_tool_effect(
    name: NamePath, tool: ToolPath, choice: ToolEffectChoice, res: ResourcesDep, caller: CallerDep
) -> SourceView:
    """Vouch for one tool's effect (every version, and versions listed later); ``null``:
    back to ``external_side_effect``. Policy applies it within its registry cache's
    lifetime."""
    _require_admin(caller)
    store = SourceStore(res.pool)
    remote = await _remote_name(store, name, tool)
    updated = await store.update(name, lambda current: with_effect(current, remote, choice.effect))
    if updated is None:
        raise _no_source(name)
    await store.restate_rules(name)
    return SourceView(
        source=updated,
        tools=await store.tools(name),
        listing=await ListingStore(res.pool).get(name),
    )


async def _remote_name(store: SourceStore, name: str, tool: str) -> str:
    """The name on the source of ``tool`` (its name there or its fleet tool id)."""
    if await store.get(name) is None:
        raise _no_source(name)
    tools = await store.tools(name)
    remote = next((t.remote_name for t in tools if tool in (t.remote_name, t.tool_id)), None)
    if remote is None:
        detail = f"the source {name!r} has no tool {tool!r}"
        if not tools:
            detail += " (none of its tools is listed yet: see GET /v1/sources/{name}/listing)"
        raise ProblemError(404, detail, code=ErrorCode.TOOL_NOT_FOUND)
    return remote


class Removed(BaseModel):
    model_config = ConfigDict(extra="forbid")

    removed: str


@router.delete("/{name}", response_model=Removed, responses=problem_responses(404))
async def remove_source(name: NamePath, res: ResourcesDep, caller: CallerDep) -> Removed:
    """Forget the source; its tools are marked removed in the registry."""
    _require_admin(caller)
    if not await SourceStore(res.pool).remove(name):
        raise _no_source(name)
    return Removed(removed=name)
