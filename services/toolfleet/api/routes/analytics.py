"""``/v1/analytics``: the stream analytics tables, per tenant, as the analytics app last
wrote them (``toolfleet worker analytics``; the API only reads its snapshots).

A caller sees its own tenant; an admin sees every tenant. Another tenant answers 404,
like an unknown one. A tenant the app has not seen yet answers an empty snapshot.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path
from pydantic import BaseModel

from toolfleet.analytics.snapshot import RedisSnapshots, TenantSnapshot
from toolfleet.api.auth import CallerDep
from toolfleet.api.problems import ProblemError, problem_responses
from toolfleet.api.resources import ApiResources, resources
from toolfleet.events.models import TENANT_ID_PATTERN

router = APIRouter(prefix="/v1/analytics", tags=["analytics"], responses=problem_responses(401))

ResourcesDep = Annotated[ApiResources, Depends(resources)]


class AnalyticsTenants(BaseModel):
    """Tenants with analytics the caller may read."""

    tenants: list[str]


@router.get("/tenants", response_model=AnalyticsTenants)
async def list_tenants(res: ResourcesDep, caller: CallerDep) -> AnalyticsTenants:
    """Tenants the analytics app has seen: all for an admin, else the caller's own."""
    seen = await RedisSnapshots(res.redis).tenants()
    return AnalyticsTenants(tenants=[t for t in seen if caller.may_see(t)])


@router.get(
    "/tenants/{tenant_id}",
    response_model=TenantSnapshot,
    responses=problem_responses(404, 422),
)
async def tenant_analytics(
    tenant_id: Annotated[str, Path(pattern=TENANT_ID_PATTERN, max_length=128)],
    res: ResourcesDep,
    caller: CallerDep,
) -> TenantSnapshot:
    """The tenant's newest 1 minute windows, its 1 hour window and recent anomalies."""
    if not caller.may_see(tenant_id):
        raise ProblemError(404, f"no analytics for tenant {tenant_id!r}")
    snapshot = await RedisSnapshots(res.redis).read(tenant_id)
    return snapshot or TenantSnapshot(tenant_id=tenant_id)
