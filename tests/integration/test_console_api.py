"""The console's page and routes against the real API, Postgres and Redis."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI

from tests.support.lifecycle import T0 as LIFE_T0
from tests.support.lifecycle import Lifecycle
from toolfleet.api.feed import RESYNC
from toolfleet.api.resources import ApiResources
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.contract.http import InvocationView
from toolfleet.events.models import ToolInvoked
from toolfleet.events.types import EventType, Source
from toolfleet.status.service import StatusProjector
from toolfleet.status.store import PostgresProjection

pytestmark = pytest.mark.integration


def _bearer(issuer: TokenIssuer, tenant: str, *scopes: str) -> dict[str, str]:
    token = issuer.issue(tenant_id=tenant, agent_did="did:user:ops", scopes=list(scopes))
    return {"Authorization": f"Bearer {token}"}


def _res(app: FastAPI) -> ApiResources:
    res = app.state.resources
    assert isinstance(res, ApiResources)
    return res


async def _insert(app: FastAPI, tenant: str, status: str = "running") -> uuid.UUID:
    invocation_id = uuid.uuid4()
    await _res(app).pool.execute(
        "INSERT INTO tool_invocations (invocation_id, tenant_id, tool_id, status, status_rank, "
        "created_at) VALUES ($1, $2, 'core__long_running', $3, 2, $4)",
        invocation_id,
        tenant,
        status,
        datetime.now(UTC),
    )
    return invocation_id


async def test_the_page_is_static_html_under_a_strict_csp(http: httpx.AsyncClient) -> None:
    page = await http.get("/console")
    assert page.status_code == 200
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "default-src 'none'" in csp
    assert "unsafe-inline" not in csp
    assert page.headers["x-frame-options"] == "DENY"
    # Every script comes from a file; no inline script, handler or style attribute.
    assert re.findall(r"<script(?![^>]*\bsrc=)", page.text) == []
    assert not re.search(r"\son[a-z]+=|\sstyle=", page.text)
    script = await http.get("/console/static/console.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    assert "sessionStorage" in script.text
    assert (await http.get("/console/static/console.css")).status_code == 200
    assert (await http.get("/console/static/secrets.txt")).status_code == 404


async def test_me_names_the_caller_and_what_it_may_decide(
    http: httpx.AsyncClient, issuer: TokenIssuer
) -> None:
    plain = await http.get("/v1/me", headers=_bearer(issuer, "t_console"))
    assert plain.json() == {
        "tenant_id": "t_console",
        "subject": "did:user:ops",
        "scopes": [],
        "admin": False,
        "may_decide": False,
    }
    approver = await http.get("/v1/me", headers=_bearer(issuer, "t_console", "approver"))
    assert approver.json()["may_decide"] is True
    assert (await http.get("/v1/me")).status_code == 401


async def test_the_timeline_reads_the_projections_event_kinds(
    app: FastAPI, http: httpx.AsyncClient, issuer: TokenIssuer
) -> None:
    tenant = f"t_{uuid.uuid4().hex[:8]}"
    invocation_id = await _insert(app, tenant)
    start = datetime.now(UTC)
    marks = [
        ("requested", 0, {}),
        ("authorized", 20, {"tool_version": "1.0.0"}),
        ("invoked", 40, {"attempt": 1, "worker_id": "w1"}),
        ("checkpoint", 300, {"checkpoint_id": "c1", "progress_percent": 50.0}),
        ("invoked", 2000, {"attempt": 2, "worker_id": "w2", "resumed_from_checkpoint_id": "c1"}),
    ]
    for kind, after_ms, detail in marks:
        await _res(app).pool.execute(
            "INSERT INTO projected_events (tenant_id, source, event_id, invocation_id, "
            "event_kind, occurred_at, detail) VALUES ($6, '/test', $1, $2, $3, $4, $5)",
            str(uuid.uuid4()),
            invocation_id,
            kind,
            start + timedelta(milliseconds=after_ms),
            detail,
            tenant,
        )
    answer = await http.get(
        f"/v1/invocations/{invocation_id}/timeline", headers=_bearer(issuer, tenant)
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [s["kind"] for s in body["steps"]] == [
        "requested",
        "authorized",
        "invoked",
        "checkpoint",
        "invoked",
    ]
    assert (body["attempts"], body["resumes"], body["handovers"]) == (2, 1, 1)
    assert body["steps"][-1]["since_previous_ms"] == 1700
    assert body["duration_ms"] is None
    other = await http.get(
        f"/v1/invocations/{invocation_id}/timeline", headers=_bearer(issuer, "t_other")
    )
    assert other.status_code == 404


async def test_circuits_list_the_shared_breaker_states(
    app: FastAPI, http: httpx.AsyncClient, issuer: TokenIssuer
) -> None:
    name = f"tool_{uuid.uuid4().hex[:6]}"
    tenant = f"t_circ_{uuid.uuid4().hex[:6]}"
    await _res(app).pool.execute(
        "INSERT INTO tool_invocations (invocation_id, tenant_id, tool_id, status, status_rank, "
        "created_at) VALUES ($1, $2, $3, 'error', 3, $4)",
        uuid.uuid4(),
        tenant,
        name,
        datetime.now(UTC),
    )
    await _res(app).redis.set(
        f"circuit:state:{name}",
        json.dumps({"status": "open", "since": 1_700_000_000.0, "window": []}),
    )
    try:
        answer = await http.get("/v1/circuits", headers=_bearer(issuer, tenant))
        # A tenant that never called the tool does not see its circuit.
        elsewhere = await http.get("/v1/circuits", headers=_bearer(issuer, "t_console"))
    finally:
        await _res(app).redis.delete(f"circuit:state:{name}")
    assert name not in [c["circuit_name"] for c in elsewhere.json()]
    circuit = next(c for c in answer.json() if c["circuit_name"] == name)
    assert circuit["state"] == "open"
    assert circuit["since"].startswith("2023-11-14")


async def test_the_feed_pushes_each_change_to_the_tenants_followers(app: FastAPI) -> None:
    feed = _res(app).feed
    tenant = f"t_{uuid.uuid4().hex[:8]}"

    async def next_view(queue: asyncio.Queue[InvocationView | str]) -> InvocationView:
        while True:
            item = await asyncio.wait_for(queue.get(), timeout=10)
            if item != RESYNC and isinstance(item, InvocationView):
                return item

    with feed.subscribe(tenant) as mine, feed.subscribe("t_somebody_else") as theirs:
        invocation_id = await _insert(app, tenant)
        seen = await next_view(mine.queue)
        assert (seen.invocation_id, seen.status.value) == (invocation_id, "running")
        await _res(app).pool.execute(
            "UPDATE tool_invocations SET status = 'success', status_rank = 3 "
            "WHERE invocation_id = $1",
            invocation_id,
        )
        finished = await next_view(mine.queue)
        assert (finished.invocation_id, finished.status.value) == (invocation_id, "success")
        assert all(not isinstance(item, InvocationView) for item in _drain(theirs.queue)), (
            "another tenant's follower saw the change"
        )


def _drain(queue: asyncio.Queue[InvocationView | str]) -> list[InvocationView | str]:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items


async def test_the_projection_records_what_the_timeline_shows(
    app: FastAPI, http: httpx.AsyncClient, issuer: TokenIssuer
) -> None:
    """Events folded by the real status projection, in a scrambled order, give the
    timeline of a call that crashed after a checkpoint and resumed on another worker."""
    life = Lifecycle(tenant=f"t_{uuid.uuid4().hex[:8]}", tool_id="core__long_running")
    resumed = ToolInvoked(
        invocation_id=uuid.UUID(life.invocation_id),
        tenant_id=life.tenant,
        agent_did=life.agent,
        tool_id=life.tool_id,
        tool_version=life.version,
        attempt=2,
        worker_id="w2",
        started_at=LIFE_T0 + timedelta(seconds=4),
        resumed_from_checkpoint_id="cp-50",
    )
    events = [
        life.outcome(at=6),
        life.checkpoint(50, "step 1", at=3),
        life._event(EventType.INVOKED, Source.EXECUTOR, resumed, 4),
        life.requested(at=0),
        life.executed(at=5),
        life.invoked(at=2),
        life.authorized(at=1),
    ]
    projector = StatusProjector(projection=PostgresProjection(_res(app).pool))
    for event in events:
        assert await projector.on_event(event)
    answer = await http.get(
        f"/v1/invocations/{life.invocation_id}/timeline", headers=_bearer(issuer, life.tenant)
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [(s["kind"], s["since_start_ms"]) for s in body["steps"]] == [
        ("requested", 0),
        ("authorized", 1000),
        ("invoked", 2000),
        ("checkpoint", 3000),
        ("invoked", 4000),
        ("executed", 5000),
        ("terminal", 6000),
    ]
    assert (body["attempts"], body["resumes"], body["handovers"]) == (2, 1, 1)
    assert body["duration_ms"] == 6000
    assert body["steps"][4]["label"] == "invoked (attempt 2, resumed, new worker)"
    assert body["steps"][4]["detail"] == {
        "attempt": 2,
        "worker_id": "w2",
        "resumed_from_checkpoint_id": "cp-50",
    }
    # What the timeline keeps is lifecycle metadata: never the parameters or the result.
    details = json.dumps([s["detail"] for s in body["steps"]])
    assert "hi" not in details
