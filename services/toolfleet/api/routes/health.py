"""Unauthenticated operational routes: liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from toolfleet.api.problems import ProblemError, problem_responses
from toolfleet.api.readiness import check_dependencies
from toolfleet.api.resources import ApiResources, resources
from toolfleet.contract.http import Health, Readiness

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Liveness: the process answers."""
    return Health()


@router.get("/readyz", response_model=Readiness, responses=problem_responses(503))
async def readyz(res: Annotated[ApiResources, Depends(resources)]) -> Readiness:
    """Readiness: the broker, Redis and Postgres are all reachable."""
    checks = await check_dependencies(res)
    failed = [f"{name} {state}" for name, state in checks.items() if state != "ok"]
    if failed:
        raise ProblemError(
            503,
            f"not ready: {', '.join(failed)}",
            headers={"Retry-After": "1"},
            extensions={"checks": checks},
        )
    return Readiness(checks=checks)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text"}},
)
async def metrics() -> Response:
    """Prometheus metrics of this process."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
