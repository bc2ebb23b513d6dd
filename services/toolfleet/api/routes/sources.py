"""``/v1/sources``: register, list, configure and remove tool sources (admin scope only).

Adding a source lists its tools at once (an MCP server is started or reached for that,
then let go) and registers each in the tool registry, so a policy can name them; no
policy allows them before it does. The answer lists the tools and their versions.
``PUT /v1/sources/{name}/tools/{tool}/rules`` sets what clients see of one tool's
results (allowlist, validation mode, sanitization, size limit), for every version;
``PUT /v1/sources/{name}/tools/{tool}/effect`` the effect an operator vouches for (a
source tool is ``external_side_effect`` until one does; its server's hints never count).
"""

from __future__ import annotations

import functools
import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Response
from pydantic import BaseModel, ConfigDict

from toolfleet.api.auth import Caller, CallerDep
from toolfleet.api.problems import ProblemError, problem_responses
from toolfleet.api.resources import ApiResources, resources
from toolfleet.errors import ErrorCode, SandboxFailure, ToolfleetError
from toolfleet.executor.settings import ExecutorSettings
from toolfleet.isolation.sandbox import probe
from toolfleet.isolation.stdio import StdioSandbox
from toolfleet.sources import http_tools
from toolfleet.sources.models import (
    SOURCE_NAME_PATTERN,
    SourceDefinition,
    SourceKind,
    SourceTool,
)
from toolfleet.sources.pool import SessionPool
from toolfleet.sources.provider import SourceCatalog
from toolfleet.sources.rules import ToolEffectChoice, ToolRules, configured, with_effect
from toolfleet.sources.store import SourceStore

log = logging.getLogger(__name__)

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
    """A source and the tools the fleet knows from it."""

    model_config = ConfigDict(extra="forbid")

    source: SourceDefinition
    tools: list[SourceTool]
    warnings: list[str] = []
    """Why the tools are not listed yet, when they are not."""


class SourceList(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sources: list[SourceDefinition]


def _require_admin(caller: Caller) -> None:
    if not caller.is_admin:
        raise ProblemError(
            403, "managing tool sources needs the admin scope", code=ErrorCode.PERMISSION_DENIED
        )


@functools.cache
def stdio_launcher() -> StdioSandbox | None:
    """How the API starts a stdio server to list its tools: in the executors' sandbox,
    under the uid just below the tools' range when root; None without a sandbox."""
    support = probe()
    if not support.sandboxes:
        return None
    return StdioSandbox(support=support, uid=ExecutorSettings().isolation_uid_base - 1)


@router.post("", response_model=SourceView, status_code=201)
async def add_source(
    source: SourceDefinition, res: ResourcesDep, caller: CallerDep, response: Response
) -> SourceView:
    """Store the source (replacing one of the same name) and register its tools.

    A source the API cannot list now (unreachable, or credentials only executors
    resolve) is stored all the same (``202``, with a warning): executors list it in the
    background once they can.
    """
    _require_admin(caller)
    store = SourceStore(res.pool)
    declared = [http_tools.source_tool(source, op).tool_id for op in source.operations]
    taken = await store.id_conflicts(source.name, declared)
    if taken:
        owners = ", ".join(f"{t} ({owner})" for t, owner in sorted(taken.items()))
        raise ProblemError(
            409,
            f"tool ids already registered by another source or a native tool: {owners}",
            code=ErrorCode.INVALID_PARAMETERS,
            extensions={"conflicting_tools": taken},
        )
    # Listing a stdio source starts its command: sandboxed here as on the executors, or
    # not at all (the executors list it) where this host has no sandbox.
    launcher = stdio_launcher()
    pool = SessionPool(launcher=launcher)
    warnings: list[str] = []
    try:
        await store.put(source)
        await store.restate_rules(source.name)  # a replaced source's known versions follow it
        if source.kind is SourceKind.MCP_STDIO and launcher is None:
            raise SandboxFailure("this API host cannot sandbox a stdio server")
        await SourceCatalog(store=store, pool=pool).refresh(source, via="add")
    except ToolfleetError as exc:
        log.warning("source not listed", extra={"source": source.name, "error": exc.code})
        response.status_code = 202
        warnings.append(
            f"stored, but its tools could not be listed now ({exc.message}); executors "
            "list them once the source answers"
        )
    finally:
        await pool.close()
    return SourceView(source=source, tools=await store.tools(source.name), warnings=warnings)


@router.get("", response_model=SourceList)
async def list_sources(res: ResourcesDep, caller: CallerDep) -> SourceList:
    _require_admin(caller)
    return SourceList(sources=await SourceStore(res.pool).sources())


@router.get("/{name}", response_model=SourceView, responses=problem_responses(404))
async def get_source(name: NamePath, res: ResourcesDep, caller: CallerDep) -> SourceView:
    """The source and every tool version it registered."""
    _require_admin(caller)
    store = SourceStore(res.pool)
    source = await store.get(name)
    if source is None:
        raise ProblemError(404, f"no source {name!r}", code=ErrorCode.TOOL_NOT_FOUND)
    return SourceView(source=source, tools=await store.tools(name))


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
        raise ProblemError(404, f"no source {name!r}", code=ErrorCode.TOOL_NOT_FOUND)
    await store.restate_rules(name)
    return SourceView(source=updated, tools=await store.tools(name))


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
        raise ProblemError(404, f"no source {name!r}", code=ErrorCode.TOOL_NOT_FOUND)
    await store.restate_rules(name)
    return SourceView(source=updated, tools=await store.tools(name))


async def _remote_name(store: SourceStore, name: str, tool: str) -> str:
    """The name on the source of ``tool`` (its name there or its fleet tool id)."""
    if await store.get(name) is None:
        raise ProblemError(404, f"no source {name!r}", code=ErrorCode.TOOL_NOT_FOUND)
    tools = await store.tools(name)
    remote = next((t.remote_name for t in tools if tool in (t.remote_name, t.tool_id)), None)
    if remote is None:
        raise ProblemError(
            404, f"the source {name!r} has no tool {tool!r}", code=ErrorCode.TOOL_NOT_FOUND
        )
    return remote


class Removed(BaseModel):
    model_config = ConfigDict(extra="forbid")

    removed: str


@router.delete("/{name}", response_model=Removed, responses=problem_responses(404))
async def remove_source(name: NamePath, res: ResourcesDep, caller: CallerDep) -> Removed:
    """Forget the source; its tools are marked removed in the registry."""
    _require_admin(caller)
    if not await SourceStore(res.pool).remove(name):
        raise ProblemError(404, f"no source {name!r}", code=ErrorCode.TOOL_NOT_FOUND)
    return Removed(removed=name)
