"""``GET /v1/invocations/{id}/events`` against the real API, Postgres and Redis."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import FastAPI

from toolfleet.api.resources import ApiResources
from toolfleet.auth.tokens import TokenIssuer

pytestmark = pytest.mark.integration


def _headers(issuer: TokenIssuer, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {issuer.issue(tenant_id=tenant, agent_did='did:agent:ui')}"}


async def _insert(app: FastAPI, tenant: str, status: str, progress: float = 0) -> uuid.UUID:
    res: ApiResources = app.state.resources
    invocation_id = uuid.uuid4()
    await res.pool.execute(
        "INSERT INTO tool_invocations (invocation_id, tenant_id, tool_id, status, status_rank, "
        "progress_percent, current_phase, latest_checkpoint, created_at) "
        "VALUES ($1, $2, $3, $4, $5, $6, '', $7, $8)",
        invocation_id,
        tenant,
        "core__long_running",
        status,
        2,
        progress,
        {"checkpoint_id": f"cp-{progress}"} if progress else None,
        datetime.now(UTC),
    )
    return invocation_id


def _kinds(body: str) -> list[str]:
    return [line[len("event: ") :] for line in body.splitlines() if line.startswith("event: ")]


async def test_events_follow_a_running_call_to_its_result(
    app: FastAPI, http: httpx.AsyncClient, issuer: TokenIssuer
) -> None:
    tenant = f"tenant_{uuid.uuid4().hex[:8]}"
    invocation_id = await _insert(app, tenant, "running", 10)
    res: ApiResources = app.state.resources

    async def run_to_the_end() -> None:
        await asyncio.sleep(0.5)
        await res.pool.execute(
            "UPDATE tool_invocations SET progress_percent = 60, current_phase = 'step 6', "
            "latest_checkpoint = $2 WHERE invocation_id = $1",
            invocation_id,
            {"checkpoint_id": "cp-6", "progress_percent": 60},
        )
        await asyncio.sleep(0.5)
        await res.pool.execute(
            "UPDATE tool_invocations SET status = 'success', status_rank = 9, "
            "progress_percent = 100, result = $2 WHERE invocation_id = $1",
            invocation_id,
            {"steps": 10},
        )

    writer = asyncio.create_task(run_to_the_end())
    answer = await http.get(
        f"/v1/invocations/{invocation_id}/events", headers=_headers(issuer, tenant), timeout=20
    )
    await writer
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/event-stream")
    assert _kinds(answer.text) == ["tool_call_start", "progress", "progress", "tool_call_result"]
    assert '"result":{"steps":10}' in answer.text


async def test_events_of_another_tenants_call_are_a_404(
    app: FastAPI, http: httpx.AsyncClient, issuer: TokenIssuer
) -> None:
    invocation_id = await _insert(app, "tenant_owner", "success", 100)
    other = await http.get(
        f"/v1/invocations/{invocation_id}/events", headers=_headers(issuer, "tenant_other")
    )
    assert other.status_code == 404
    assert other.headers["content-type"] == "application/problem+json"
    unauthenticated = await http.get(f"/v1/invocations/{invocation_id}/events")
    assert unauthenticated.status_code == 401
