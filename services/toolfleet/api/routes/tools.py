"""``/v1/tools``: the registry, read-only, as far as the caller's tenant policy allows.

An admin sees every tool; any other caller only the tools its tenant's policy (with its
agent's narrowing) allows, and a disallowed tool answers 404 like an unknown one.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query

from toolfleet.api.auth import CallerDep
from toolfleet.api.catalog import catalog_view
from toolfleet.api.models import ToolDetail, ToolPage, ToolSummary
from toolfleet.api.problems import ProblemError, problem_responses
from toolfleet.api.resources import ApiResources, resources
from toolfleet.errors import ErrorCode
from toolfleet.policy.catalog import visible_page

router = APIRouter(prefix="/v1/tools", tags=["tools"], responses=problem_responses(401, 422))

ResourcesDep = Annotated[ApiResources, Depends(resources)]


@router.get("", response_model=ToolPage)
async def list_tools(
    res: ResourcesDep,
    caller: CallerDep,
    category: Annotated[str | None, Query(max_length=128)] = None,
    tag: Annotated[str | None, Query(max_length=128)] = None,
    q: Annotated[
        str | None, Query(max_length=256, description="Substring of id or description")
    ] = None,
    page: Annotated[int, Query(ge=1, le=100_000)] = 1,
    page_size: Annotated[int, Query(ge=1, le=200)] = 50,
) -> ToolPage:
    """Registered tools with their versions and lifecycle states, by tool id."""

    async def fetch(limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
        return await res.registry.list_tools(
            category=category, tag=tag, q=q, limit=limit, offset=offset
        )

    rows, total = await visible_page(
        await catalog_view(res, caller), fetch, offset=(page - 1) * page_size, limit=page_size
    )
    return ToolPage(
        items=[ToolSummary.model_validate(r) for r in rows],
        page=page,
        page_size=page_size,
        total=total,
    )


@router.get("/{tool_id}", response_model=ToolDetail, responses=problem_responses(404))
async def get_tool(tool_id: str, res: ResourcesDep, caller: CallerDep) -> ToolDetail:
    """One tool with every version's manifest, newest first."""
    view = await catalog_view(res, caller)
    found = await res.registry.tool(tool_id) if view.shows(tool_id) else None
    if found is None:
        raise ProblemError(
            404, f"tool {tool_id!r} is not registered", code=ErrorCode.TOOL_NOT_FOUND
        )
    return ToolDetail.model_validate(found)
