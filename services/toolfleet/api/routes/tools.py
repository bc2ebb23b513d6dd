"""``/v1/tools``: the registry as far as the caller's tenant policy allows, and its lifecycle.

An admin sees every tool; any other caller only the tools its tenant's policy (with its
agent's narrowing) allows, and a disallowed tool answers 404 like an unknown one.
``q`` ranks by words and meaning (BM25 over names, descriptions, tags, parameters and
keywords, blended with embeddings; see :mod:`toolfleet.registry.search`). Only an admin
moves a version along its lifecycle; each move is announced as
``ai.agent.tool.lifecycle.changed``, which audit records with the operator.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query

from toolfleet.api.auth import CallerDep
from toolfleet.api.catalog import catalog_view
from toolfleet.api.invoking import publishing
from toolfleet.api.problems import ProblemError, problem_responses
from toolfleet.api.resources import ApiResources, resources
from toolfleet.contract.http import (
    LifecyclePatch,
    LifecycleResult,
    ToolDetail,
    ToolPage,
    ToolSummary,
)
from toolfleet.contract.manifest import LifecycleState
from toolfleet.errors import ErrorCode, InvalidParameters, StateConflict, ToolNotFound
from toolfleet.events.envelope import new_event
from toolfleet.events.models import ToolLifecycleChanged
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.policy.catalog import visible_page
from toolfleet.registry.search import MIN_SCORE
from toolfleet.registry.store import LifecycleChange
from toolfleet.registry.versions import sunset_follows

router = APIRouter(prefix="/v1/tools", tags=["tools"], responses=problem_responses(401, 422))

ResourcesDep = Annotated[ApiResources, Depends(resources)]


@router.get("", response_model=ToolPage)
async def list_tools(
    res: ResourcesDep,
    caller: CallerDep,
    category: Annotated[str | None, Query(max_length=128)] = None,
    tag: Annotated[str | None, Query(max_length=128)] = None,
    q: Annotated[
        str | None,
        Query(max_length=256, description="What the tool should do; results rank by meaning."),
    ] = None,
    min_score: Annotated[
        float,
        Query(
            ge=-1,
            le=1,
            description="With q: leave out tools scoring under this (-1: rank them all).",
        ),
    ] = MIN_SCORE,
    page: Annotated[int, Query(ge=1, le=100_000)] = 1,
    page_size: Annotated[int, Query(ge=1, le=200)] = 50,
) -> ToolPage:
    """Registered tools with their versions and lifecycle states: by tool id, or with
    ``q`` the ones that match, most relevant first, each with its ``score`` (weak
    matches marked ``low_relevance``). Removed versions are left out."""

    view = await catalog_view(res, caller)

    async def fetch(limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
        return await res.registry.list_tools(
            category=category,
            tag=tag,
            q=q or None,
            min_score=min_score,
            limit=limit,
            offset=offset,
            shows=view.shows,
        )

    rows, total = await visible_page(view, fetch, offset=(page - 1) * page_size, limit=page_size)
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


@router.patch(
    "/{tool_id}/versions/{version}",
    response_model=LifecycleResult,
    responses=problem_responses(403, 404, 409, 503),
)
async def change_lifecycle(
    tool_id: str,
    version: Annotated[str, Path(max_length=64)],
    patch: LifecyclePatch,
    res: ResourcesDep,
    caller: CallerDep,
) -> LifecycleResult:
    """Deprecate, sunset or remove one version (admin scope); audited with the operator.

    Versions only move forward; restating the current state updates its dates and
    announces it again (so a retry after a broker outage is safe).
    """
    if not caller.is_admin:
        raise ProblemError(
            403,
            "changing a tool's lifecycle needs the admin scope",
            code=ErrorCode.PERMISSION_DENIED,
        )
    if patch.lifecycle_state is LifecycleState.ACTIVE:
        raise ProblemError(
            409, "a version cannot be made active again", code=ErrorCode.STATE_CONFLICT
        )
    _check_dates(patch)
    try:
        changed = await res.registry.change_lifecycle(
            LifecycleChange(
                tool_id=tool_id,
                version=version,
                state=patch.lifecycle_state,
                operator=caller.subject,
                sunset_date=patch.sunset_date,
                deprecation_date=patch.deprecation_date,
                deprecated_in_favor_of=patch.deprecated_in_favor_of,
                message=patch.message,
            )
        )
    except ToolNotFound as exc:
        raise ProblemError(404, exc.message, code=exc.code) from None
    except StateConflict as exc:
        raise ProblemError(409, exc.message, code=exc.code, extensions=exc.details) from None
    except InvalidParameters as exc:
        raise ProblemError(422, exc.message, code=exc.code, extensions=exc.details) from None
    manifest = changed.manifest
    now = datetime.now(UTC)
    notice = ToolLifecycleChanged(
        tool_id=tool_id,
        tool_version=version,
        previous_state=changed.previous_state.value,
        lifecycle_state=manifest.lifecycle_state.value,
        operator=caller.subject,
        deprecation_date=manifest.deprecation_date,
        sunset_date=manifest.sunset_date,
        deprecated_in_favor_of=manifest.deprecated_in_favor_of,
        at=now,
    )
    async with publishing():
        await res.client.emit(
            new_event(
                event_type=EventType.TOOL_LIFECYCLE_CHANGED,
                source=Source.API,
                data=notice,
                tenant_id=caller.tenant_id,
                invocation_id=None,
                authtype="app_user",
                authid=caller.subject,
            ),
            TopicName.EVENTS,
        )
    return LifecycleResult(
        tool_id=tool_id,
        version=version,
        previous_state=changed.previous_state,
        lifecycle_state=manifest.state_at(now),
        deprecation_date=manifest.deprecation_date,
        sunset_date=manifest.sunset_date,
        deprecated_in_favor_of=manifest.deprecated_in_favor_of,
        changed_by=caller.subject,
    )


def _check_dates(patch: LifecyclePatch) -> None:
    """Dates are timezone-aware, the sunset comes after the deprecation (a sunset may
    share its instant), and a removal has none (the store checks the dates against
    those already set)."""
    dates = {"deprecation_date": patch.deprecation_date, "sunset_date": patch.sunset_date}
    given = {name: when for name, when in dates.items() if when is not None}
    if given and patch.lifecycle_state is LifecycleState.REMOVED:
        raise ProblemError(
            422,
            f"a removal takes effect now and has no dates (got {', '.join(given)})",
            code=ErrorCode.INVALID_PARAMETERS,
        )
    for name, when in given.items():
        if when.tzinfo is None:
            raise ProblemError(
                422,
                f"{name} needs a timezone (e.g. 2027-01-31T00:00:00Z)",
                code=ErrorCode.INVALID_PARAMETERS,
                extensions={"field": name},
            )
    if (
        patch.deprecation_date is not None
        and patch.sunset_date is not None
        and not sunset_follows(
            patch.deprecation_date, patch.sunset_date, state=patch.lifecycle_state
        )
    ):
        raise ProblemError(
            422,
            "sunset_date must come after deprecation_date",
            code=ErrorCode.INVALID_PARAMETERS,
            extensions={
                "deprecation_date": patch.deprecation_date.isoformat(),
                "sunset_date": patch.sunset_date.isoformat(),
            },
        )
