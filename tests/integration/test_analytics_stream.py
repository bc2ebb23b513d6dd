"""``GET /v1/analytics/tenants/{tenant}/events``: the console's charts, pushed as the
analytics app writes each snapshot; only the caller's own tenant."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from fastapi import FastAPI

from tests.support.analytics import write_snapshots
from tests.support.eventually import eventually
from tests.support.servers import served_by_uvicorn
from toolfleet.analytics.snapshot import TenantSnapshot
from toolfleet.api.routes.analytics import SnapshotChanges
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration

NOW = datetime(2026, 11, 25, 12, 0, 30, tzinfo=UTC)


@pytest.fixture
async def served(app: FastAPI) -> AsyncIterator[str]:
    """``app`` behind uvicorn: real streaming (the in-process transport buffers)."""
    async with served_by_uvicorn(lambda _url: app, lifespan="off") as url:
        yield url


def _bearer(issuer: TokenIssuer, tenant: str) -> dict[str, str]:
    token = issuer.issue(tenant_id=tenant, agent_did="did:user:ops", scopes=[])
    return {"Authorization": f"Bearer {token}"}


async def _write(settings: FleetSettings, tenant: str, calls: int) -> None:
    """What the analytics app writes after counting ``calls`` calls of ``tenant``."""
    await write_snapshots(settings, {tenant: calls}, now=NOW)


async def _snapshots(response: httpx.Response) -> AsyncIterator[TenantSnapshot]:
    name = "message"
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: ") and name == "snapshot":
            yield TenantSnapshot.model_validate(json.loads(line[len("data: ") :]))


def _calls(snap: TenantSnapshot) -> int:
    return snap.minutes[0].totals.calls if snap.minutes else 0


async def test_each_write_of_the_tenant_s_snapshot_is_pushed_and_no_one_else_s(
    app: FastAPI, served: str, issuer: TokenIssuer, settings: FleetSettings
) -> None:
    mine, theirs = f"t_live_{uuid.uuid4().hex[:8]}", f"t_live_{uuid.uuid4().hex[:8]}"
    path = f"/v1/analytics/tenants/{mine}/events"
    async with (
        httpx.AsyncClient(base_url=served, timeout=10) as http,
        http.stream("GET", path, headers=_bearer(issuer, mine)) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        seen = _snapshots(response)
        first = await asyncio.wait_for(anext(seen), 5)
        assert (first.tenant_id, _calls(first)) == (mine, 0)

        changes = app.state.analytics_changes
        assert isinstance(changes, SnapshotChanges)

        async def subscribed() -> bool:
            return changes._task is not None and len(changes._followers) == 1

        await eventually(subscribed, timeout=5)
        for calls in (2, 5):
            await _write(settings, theirs, 7)  # another tenant's write: not pushed here
            await _write(settings, mine, calls)
            pushed = await asyncio.wait_for(anext(seen), 5)
            # Without the push the stream only sends keep-alives: this times out.
            while _calls(pushed) != calls:
                assert pushed.tenant_id == mine
                pushed = await asyncio.wait_for(anext(seen), 5)
            assert pushed.tenant_id == mine

    async def released() -> bool:
        return not changes._followers and changes._stop is None

    await eventually(released, timeout=5)


async def test_another_tenant_s_stream_is_a_404_like_an_unknown_one(
    served: str, issuer: TokenIssuer
) -> None:
    async with httpx.AsyncClient(base_url=served, timeout=10) as http:
        other = await http.get(
            "/v1/analytics/tenants/t_someone_else/events", headers=_bearer(issuer, "t_me")
        )
        anonymous = await http.get("/v1/analytics/tenants/t_me/events")
        hostile = await http.get(
            "/v1/analytics/tenants/t_me%2A/events", headers=_bearer(issuer, "t_me")
        )
    assert other.status_code == 404
    assert anonymous.status_code == 401
    assert hostile.status_code in {404, 422}
