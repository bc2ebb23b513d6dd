"""``/v1/policies/{tenant}``: read and replace a tenant's policy (admin scope only).

A write is checked against the registry (a literal tool id it does not know is a 422
naming it; an allow glob that seems to allow MCP or HTTP source tools, which only their
exact ids allow, is stored with a warning), stored with a new version, and announced on
``policy:updates`` so every policy process drops its cached copy within a second.
``If-Match: "<version>"`` makes the write conditional (412 when the policy changed
meanwhile).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict
from redis.exceptions import RedisError

from toolfleet.api.auth import Caller, CallerDep
from toolfleet.api.problems import FieldError, ProblemError, problem_response, problem_responses
from toolfleet.api.resources import ApiResources, resources
from toolfleet.errors import ErrorCode
from toolfleet.events.models import TENANT_ID_PATTERN
from toolfleet.policy.cache import RedisPolicyCache
from toolfleet.policy.documents import (
    TenantPolicy,
    UnknownTools,
    check_known_tools,
    named_tools,
)
from toolfleet.policy.postgres_policies import (
    PolicyStore,
    PolicyVersionConflict,
    registered_tool_ids,
)
from toolfleet.sources.naming import glob_warnings
from toolfleet.sources.store import SourceStore

log = logging.getLogger(__name__)

router = APIRouter(
    prefix="/v1/policies", tags=["policies"], responses=problem_responses(401, 403, 422)
)

ResourcesDep = Annotated[ApiResources, Depends(resources)]
TenantPath = Annotated[
    str,
    Path(
        pattern=rf"^\*$|{TENANT_ID_PATTERN}",
        description='Tenant id, or "*" for every tenant without a policy of its own.',
    ),
]


class PolicyView(BaseModel):
    """A tenant's stored policy and its version."""

    model_config = ConfigDict(extra="forbid")

    tenant_id: str
    version: int
    """Increments on every write; send it back in ``If-Match`` for a conditional write."""
    updated_at: datetime
    updated_by: str
    """Subject of the token that wrote it (``seed:policy-file`` for the seed file)."""
    policy: TenantPolicy
    warnings: list[str] = []


def _require_admin(caller: Caller) -> None:
    if not caller.is_admin:
        raise ProblemError(
            403,
            "reading or changing policies needs the admin scope",
            code=ErrorCode.PERMISSION_DENIED,
        )


@router.get("/{tenant_id}", response_model=PolicyView, responses=problem_responses(404))
async def get_policy(tenant_id: TenantPath, res: ResourcesDep, caller: CallerDep) -> PolicyView:
    """The tenant's own stored policy (no ``"*"`` fallback)."""
    _require_admin(caller)
    record = await PolicyStore(res.pool).record(tenant_id)
    if record is None:
        raise ProblemError(404, f"no policy is stored for {tenant_id!r}")
    return PolicyView(
        tenant_id=record.tenant_id,
        version=record.version,
        updated_at=record.updated_at,
        updated_by=record.updated_by,
        policy=record.policy,
    )


@router.put("/{tenant_id}", response_model=PolicyView, responses=problem_responses(412))
async def put_policy(
    request: Request,
    tenant_id: TenantPath,
    policy: TenantPolicy,
    res: ResourcesDep,
    caller: CallerDep,
    if_match: Annotated[
        str | None,
        Header(description='Write only if the stored version is this one ("0": none yet).'),
    ] = None,
) -> PolicyView | JSONResponse:
    """Replace the tenant's policy; the answer carries the new version."""
    _require_admin(caller)
    expected = _expected_version(if_match)
    known = await registered_tool_ids(res.pool)
    try:
        check_known_tools(policy, known)
    except UnknownTools as exc:
        return problem_response(
            request,
            422,
            exc.message,
            code=exc.code,
            errors=[
                FieldError(
                    field=f"body.{where}",
                    message=f"{tool!r} is not registered",
                    type="unknown_tool",
                )
                for where, tool in exc.unknown.items()
            ],
            extensions={"unknown_tools": exc.tool_ids},
        )
    try:
        record = await PolicyStore(res.pool).write(
            tenant_id, policy, caller.subject, expected_version=expected
        )
    except PolicyVersionConflict as exc:
        raise ProblemError(412, exc.message, code=exc.code, extensions=exc.details) from None
    allows = [(w, p) for w, p in named_tools(policy) if ".allow_tools." in f".{w}"]
    warnings = glob_warnings(allows, known, source_tools=await SourceStore(res.pool).tool_ids())
    try:
        await RedisPolicyCache(res.redis).announce(tenant_id)
    except (RedisError, OSError):
        log.warning("policy stored but not announced", extra={"tenant_id": tenant_id})
        warnings.append(
            "stored, but Redis is unreachable: processes may apply the previous policy "
            "for up to 5 minutes"
        )
    return PolicyView(
        tenant_id=record.tenant_id,
        version=record.version,
        updated_at=record.updated_at,
        updated_by=record.updated_by,
        policy=record.policy,
        warnings=warnings,
    )


def _expected_version(if_match: str | None) -> int | None:
    if if_match is None or if_match.strip() == "*":
        return None
    text = if_match.strip().removeprefix("W/").strip('"')
    if not text.isdigit():
        raise ProblemError(
            422, 'If-Match must be a policy version, e.g. "3"', code=ErrorCode.INVALID_PARAMETERS
        )
    return int(text)
