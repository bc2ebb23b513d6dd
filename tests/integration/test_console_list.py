"""The console's list route: filters, search by id and keyset paging, tenant-scoped."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI

from toolfleet.api.resources import ApiResources
from toolfleet.auth.tokens import TokenIssuer

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _bearer(issuer: TokenIssuer, tenant: str) -> dict[str, str]:
    token = issuer.issue(tenant_id=tenant, agent_did="did:user:ops", scopes=[])
    return {"Authorization": f"Bearer {token}"}


async def _insert(
    app: FastAPI,
    tenant: str,
    *,
    minute: int,
    status: str = "success",
    tool: str = "core__echo",
    agent: str = "did:agent:a",
) -> uuid.UUID:
    res = app.state.resources
    assert isinstance(res, ApiResources)
    invocation_id = uuid.uuid4()
    await res.pool.execute(
        "INSERT INTO tool_invocations (invocation_id, tenant_id, agent_did, tool_id, status, "
        "status_rank, created_at) VALUES ($1, $2, $3, $4, $5, 3, $6)",
        invocation_id,
        tenant,
        agent,
        tool,
        status,
        T0 + timedelta(minutes=minute),
    )
    return invocation_id


async def _ids(http: httpx.AsyncClient, headers: dict[str, str], **params: str) -> list[str]:
    answer = await http.get("/v1/console/invocations", params=params, headers=headers)
    assert answer.status_code == 200, answer.text
    return [item["invocation_id"] for item in answer.json()["items"]]


async def test_the_list_filters_by_status_tool_agent_time_and_id(
    app: FastAPI, http: httpx.AsyncClient, issuer: TokenIssuer
) -> None:
    tenant = f"t_list_{uuid.uuid4().hex[:8]}"
    me = _bearer(issuer, tenant)
    ok = await _insert(app, tenant, minute=0)
    failed = await _insert(app, tenant, minute=1, status="error", tool="core__fail")
    other_agent = await _insert(app, tenant, minute=2, agent="did:agent:b")
    late = await _insert(app, tenant, minute=30)
    elsewhere = await _insert(app, "t_someone_else", minute=3)

    assert await _ids(http, me) == [str(late), str(other_agent), str(failed), str(ok)]
    assert await _ids(http, me, status="error") == [str(failed)]
    assert await _ids(http, me, tool_id="core__fail") == [str(failed)]
    assert await _ids(http, me, agent="did:agent:b") == [str(other_agent)]
    window = {
        "since": (T0 + timedelta(minutes=1)).isoformat(),
        "until": (T0 + timedelta(minutes=3)).isoformat(),
    }
    assert await _ids(http, me, **window) == [str(other_agent), str(failed)]
    assert await _ids(http, me, invocation_id=str(ok)) == [str(ok)]
    # Another tenant's id finds nothing, as a missing one does.
    assert await _ids(http, me, invocation_id=str(elsewhere)) == []
    assert await _ids(http, me, invocation_id=str(uuid.uuid4())) == []
    naive = await http.get(
        "/v1/console/invocations", params={"since": "2026-03-01T12:00:00"}, headers=me
    )
    assert naive.status_code == 422


async def test_the_list_pages_over_the_whole_history_by_cursor(
    app: FastAPI, http: httpx.AsyncClient, issuer: TokenIssuer
) -> None:
    tenant = f"t_page_{uuid.uuid4().hex[:8]}"
    me = _bearer(issuer, tenant)
    made = [await _insert(app, tenant, minute=m) for m in range(7)]
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params = {"limit": "3", "status": "success"} | ({"cursor": cursor} if cursor else {})
        answer = (await http.get("/v1/console/invocations", params=params, headers=me)).json()
        seen += [item["invocation_id"] for item in answer["items"]]
        pages += 1
        cursor = answer["next_cursor"]
        if cursor is None:
            break
    assert pages == 3
    assert seen == [str(i) for i in reversed(made)]
    bad = await http.get("/v1/console/invocations", params={"cursor": "nope"}, headers=me)
    assert bad.status_code == 422


async def test_the_page_links_a_favicon_that_is_served(http: httpx.AsyncClient) -> None:
    page = await http.get("/console")
    assert 'rel="icon" href="/console/favicon.svg"' in page.text
    icon = await http.get("/console/favicon.svg")
    assert icon.status_code == 200
    assert icon.headers["content-type"].startswith("image/svg+xml")


async def test_a_call_reads_with_its_masked_parameters_and_hides_other_tenants(
    app: FastAPI, http: httpx.AsyncClient, issuer: TokenIssuer
) -> None:
    tenant = f"t_call_{uuid.uuid4().hex[:8]}"
    mine = await _insert(app, tenant, minute=0, status="error")
    res = app.state.resources
    assert isinstance(res, ApiResources)
    await res.pool.execute(
        "UPDATE tool_invocations SET parameters = $1::jsonb, parameters_hash = 'h1', "
        "error = $2::jsonb WHERE invocation_id = $3",
        {"message": "hi", "api_key": "***"},
        {"code": "tool_execution_error", "message": "boom"},
        mine,
    )
    theirs = await _insert(app, "t_call_other", minute=0)
    me = _bearer(issuer, tenant)
    answer = await http.get(f"/v1/console/invocations/{mine}", headers=me)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["parameters"] == {"message": "hi", "api_key": "***"}
    assert body["parameters_hash"] == "h1"
    assert body["invocation"]["error"]["message"] == "boom"
    missing = await http.get(f"/v1/console/invocations/{uuid.uuid4()}", headers=me)
    foreign = await http.get(f"/v1/console/invocations/{theirs}", headers=me)
    assert missing.status_code == foreign.status_code == 404
    assert missing.json()["detail"] == foreign.json()["detail"]
    page = await http.get(f"/console/invocations/{mine}")
    assert page.status_code == 200
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert f'data-invocation="{mine}"' in page.text
    assert (await http.get("/console/invocations/not-an-id")).status_code == 422


async def test_paging_ten_thousand_calls_in_a_tenant_stays_on_the_index(
    app: FastAPI, http: httpx.AsyncClient, issuer: TokenIssuer
) -> None:
    tenant = f"t_big_{uuid.uuid4().hex[:8]}"
    res = app.state.resources
    assert isinstance(res, ApiResources)
    await res.pool.execute(
        """INSERT INTO tool_invocations (invocation_id, tenant_id, agent_did, tool_id, status,
               status_rank, created_at)
           SELECT gen_random_uuid(), $1, 'did:agent:' || (n % 7), 'core__echo',
                  CASE WHEN n % 10 = 0 THEN 'error' ELSE 'success' END, 3,
                  $2::timestamptz + n * interval '1 second'
           FROM generate_series(1, 10000) AS n""",
        tenant,
        T0,
    )
    await res.pool.execute("ANALYZE tool_invocations")
    me = _bearer(issuer, tenant)
    cursor: str | None = None
    pages = 0
    seen = 0
    while pages < 6:
        params = {"limit": "200", "status": "error"} | ({"cursor": cursor} if cursor else {})
        answer = (await http.get("/v1/console/invocations", params=params, headers=me)).json()
        seen += len(answer["items"])
        pages += 1
        cursor = answer["next_cursor"]
        if cursor is None:
            break
    assert (pages, seen, cursor) == (5, 1000, None)
    plan_rows = await res.pool.fetch(
        """EXPLAIN (FORMAT TEXT) SELECT invocation_id FROM tool_invocations
           WHERE tenant_id = $1 AND (created_at, invocation_id) < ($2, $3)
           ORDER BY created_at DESC, invocation_id DESC LIMIT 51""",
        tenant,
        T0 + timedelta(hours=2),
        uuid.uuid4(),
    )
    plan = "\n".join(r[0] for r in plan_rows)
    assert "tool_invocations_tenant_created" in plan, plan
