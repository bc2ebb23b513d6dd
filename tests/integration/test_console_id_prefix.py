"""The console's search by id prefix: the short id the list shows finds the call, only in
the caller's tenant, on the ``(tenant_id, invocation_id)`` key."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from fastapi import FastAPI

from toolfleet.api.queries import InvocationFilter, InvocationQueries, prefix_range
from toolfleet.api.resources import ApiResources
from toolfleet.auth.tokens import TokenIssuer

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)


def _bearer(issuer: TokenIssuer, tenant: str) -> dict[str, str]:
    token = issuer.issue(tenant_id=tenant, agent_did="did:user:ops", scopes=[])
    return {"Authorization": f"Bearer {token}"}


def _resources(app: FastAPI) -> ApiResources:
    res = app.state.resources
    assert isinstance(res, ApiResources)
    return res


async def _insert(app: FastAPI, tenant: str, invocation_id: uuid.UUID, minute: int) -> None:
    await _resources(app).pool.execute(
        "INSERT INTO tool_invocations (invocation_id, tenant_id, agent_did, tool_id, status, "
        "status_rank, created_at) VALUES ($1, $2, 'did:agent:a', 'core__echo', 'success', 3, $3)",
        invocation_id,
        tenant,
        T0 + timedelta(minutes=minute),
    )


async def _search(http: httpx.AsyncClient, headers: dict[str, str], text: str) -> httpx.Response:
    return await http.get(
        "/v1/console/invocations", params={"invocation_id": text}, headers=headers
    )


async def test_a_prefix_finds_the_tenant_s_calls_and_never_another_tenant_s(
    app: FastAPI, http: httpx.AsyncClient, issuer: TokenIssuer
) -> None:
    short = uuid.uuid4().hex[:8]
    mine, theirs = f"t_pfx_{uuid.uuid4().hex[:8]}", f"t_pfx_{uuid.uuid4().hex[:8]}"
    first = uuid.UUID(f"{short}-0000-4000-8000-{uuid.uuid4().hex[:12]}")
    second = uuid.UUID(f"{short}-ffff-4000-8000-{uuid.uuid4().hex[:12]}")
    other_prefix = uuid.UUID(f"{int(short, 16) ^ 1:08x}-1234-4000-8000-000000000000")
    await _insert(app, mine, first, 0)
    await _insert(app, mine, second, 1)
    await _insert(app, mine, other_prefix, 2)
    # The attack: another tenant holds a call under the same prefix, and one under the
    # very same id as mine (a request that named my id).
    stolen = uuid.UUID(f"{short}-7777-4000-8000-000000000000")
    await _insert(app, theirs, stolen, 3)
    await _insert(app, theirs, first, 4)
    me = _bearer(issuer, mine)

    async def ids(text: str) -> list[str]:
        answer = await _search(http, me, text)
        assert answer.status_code == 200, answer.text
        return [item["invocation_id"] for item in answer.json()["items"]]

    assert await ids(short) == [str(second), str(first)]
    assert await ids(short.upper()) == [str(second), str(first)]
    assert await ids(f"{short}-ff") == [str(second)]
    assert await ids(str(first)[:13]) == [str(first)]
    assert await ids(str(first)) == [str(first)]  # a full id still works
    assert await ids(str(stolen)[:18]) == []  # another tenant's prefix finds nothing
    assert await ids(str(stolen)) == []
    theirs_sees = [
        i["invocation_id"]
        for i in (await _search(http, _bearer(issuer, theirs), short)).json()["items"]
    ]
    assert theirs_sees == [str(first), str(stolen)]  # their own rows, not mine
    assert str(second) not in theirs_sees


@pytest.mark.parametrize(
    "text",
    ["abcd123", "abcd123g", "abcd1234%", "abcd_234", "abcd1234-", "abc-d1234", "abcd12345-1"],
)
async def test_a_short_or_hostile_prefix_is_refused(
    http: httpx.AsyncClient, issuer: TokenIssuer, text: str
) -> None:
    answer = await _search(http, _bearer(issuer, "t_pfx_hostile"), text)
    # "abcd1234-" is a valid prefix of the canonical form: accepted as one.
    expected = 200 if text == "abcd1234-" else 422
    assert answer.status_code == expected, (text, answer.text)


async def test_a_prefix_search_runs_on_the_primary_key(app: FastAPI) -> None:
    tenant = f"t_pfx_big_{uuid.uuid4().hex[:8]}"
    res = _resources(app)
    await res.pool.execute(
        """INSERT INTO tool_invocations (invocation_id, tenant_id, agent_did, tool_id, status,
               status_rank, created_at)
           SELECT gen_random_uuid(), $1, 'did:agent:a', 'core__echo', 'success', 3,
                  $2::timestamptz + n * interval '1 second'
           FROM generate_series(1, 20000) AS n""",
        tenant,
        T0,
    )
    await res.pool.execute("ANALYZE tool_invocations")
    row = await res.pool.fetchrow(
        "SELECT invocation_id FROM tool_invocations WHERE tenant_id = $1 LIMIT 1", tenant
    )
    assert row is not None
    wanted: uuid.UUID = row["invocation_id"]
    low, high = prefix_range(str(wanted)[:8])
    page = await InvocationQueries(res.pool).page(
        InvocationFilter(tenant_id=tenant, id_range=(low, high))
    )
    assert wanted in [i.invocation_id for i in page.items]
    plan_rows = await res.pool.fetch(
        """EXPLAIN (FORMAT TEXT) SELECT invocation_id FROM tool_invocations
           WHERE tenant_id = $1 AND invocation_id BETWEEN $2 AND $3
           ORDER BY created_at DESC, invocation_id DESC LIMIT 51""",
        tenant,
        low,
        high,
    )
    plan = "\n".join(r[0] for r in plan_rows)
    assert "Seq Scan" not in plan, plan
    assert "Index Cond" in plan, plan
    assert "invocation_id >=" in plan, plan
