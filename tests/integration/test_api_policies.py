"""``/v1/policies`` and policy-filtered ``/v1/tools`` against real Postgres and Redis."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from fastapi import FastAPI

from tests.support.api import ApiKeys, api_settings_for, running_app
from toolfleet.api import ApiSettings
from toolfleet.api.resources import ApiResources
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.executor.registration import register_catalog
from toolfleet.registry.catalog import discover
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"
Auth = Callable[..., dict[str, str]]


@pytest.fixture(scope="module")
def api_settings(
    settings: FleetSettings, module_database_url: str, module_redis_url: str, api_keys: ApiKeys
) -> ApiSettings:
    # A fleet of its own (database and Redis): the catalog assertions cover every policy,
    # and the pipeline tests seed a wildcard tenant policy into the session's fleet.
    return api_settings_for(
        settings, api_keys, database_url=module_database_url, redis_url=module_redis_url
    )


@pytest.fixture(scope="module")
async def app(api_settings: ApiSettings) -> AsyncIterator[FastAPI]:
    async with running_app(api_settings) as application:
        res: ApiResources = application.state.resources
        await register_catalog(res.pool, discover([]))
        yield application


@pytest.fixture
def auth(issuer: TokenIssuer) -> Auth:
    def headers(
        tenant: str, *, admin: bool = False, agent: str = "did:agent:test"
    ) -> dict[str, str]:
        token = issuer.issue(tenant_id=tenant, agent_did=agent, scopes=["admin"] if admin else None)
        return {"Authorization": f"Bearer {token}"}

    return headers


def tenant() -> str:
    return f"tenant_{uuid.uuid4().hex[:10]}"


async def test_put_then_get_with_versions(http: httpx.AsyncClient, auth: Auth) -> None:
    t, admin = tenant(), auth("ops", admin=True, agent="did:admin:ops")
    assert (await http.get(f"/v1/policies/{t}", headers=admin)).status_code == 404
    body = {"allow_tools": ["core__*"], "budgets": {"max_runtime_ms": 500}}
    first = await http.put(f"/v1/policies/{t}", json=body, headers=admin)
    assert first.status_code == 200, first.text
    assert first.json()["version"] == 1
    assert first.json()["updated_by"] == "did:admin:ops"
    second = await http.put(
        f"/v1/policies/{t}", json={"allow_tools": ["core__echo"]}, headers=admin
    )
    assert second.json()["version"] == 2
    got = (await http.get(f"/v1/policies/{t}", headers=admin)).json()
    assert got["version"] == 2
    assert got["policy"]["allow_tools"] == ["core__echo"]
    assert got["policy"]["max_concurrent_per_agent"] == 4


async def test_if_match_makes_the_write_conditional(http: httpx.AsyncClient, auth: Auth) -> None:
    t, admin = tenant(), auth("ops", admin=True)
    body = {"allow_tools": ["core__*"]}
    created = await http.put(f"/v1/policies/{t}", json=body, headers={**admin, "If-Match": '"0"'})
    assert created.json()["version"] == 1
    stale = await http.put(f"/v1/policies/{t}", json=body, headers={**admin, "If-Match": '"0"'})
    assert stale.status_code == 412
    assert stale.headers["content-type"] == PROBLEM
    assert stale.json()["code"] == "state_conflict"
    assert stale.json()["current_version"] == 1
    ok = await http.put(f"/v1/policies/{t}", json=body, headers={**admin, "If-Match": '"1"'})
    assert ok.json()["version"] == 2


async def test_non_admin_is_403(http: httpx.AsyncClient, auth: Auth) -> None:
    t = tenant()
    own = auth(t)
    put = await http.put(f"/v1/policies/{t}", json={"allow_tools": ["core__*"]}, headers=own)
    assert put.status_code == 403
    assert put.headers["content-type"] == PROBLEM
    assert put.json()["code"] == "permission_denied"
    assert (await http.get(f"/v1/policies/{t}", headers=own)).status_code == 403
    assert (await http.get(f"/v1/policies/{t}")).status_code == 401


async def test_invalid_document_is_422_with_fields(http: httpx.AsyncClient, auth: Auth) -> None:
    response = await http.put(
        f"/v1/policies/{tenant()}",
        json={"allow_tool": ["core__*"], "budgets": {"max_runtime_ms": 0}},
        headers=auth("ops", admin=True),
    )
    assert response.status_code == 422
    assert response.headers["content-type"] == PROBLEM
    fields = {e["field"] for e in response.json()["errors"]}
    assert {"body.allow_tool", "body.budgets.max_runtime_ms"} <= fields


async def test_unknown_tools_are_422_naming_them(http: httpx.AsyncClient, auth: Auth) -> None:
    t, admin = tenant(), auth("ops", admin=True)
    response = await http.put(
        f"/v1/policies/{t}",
        json={"allow_tools": ["core__*", "core__ecko"], "deny_tools": ["acme__*"]},
        headers=admin,
    )
    assert response.status_code == 422
    problem = response.json()
    assert problem["unknown_tools"] == ["core__ecko"]
    assert problem["errors"][0]["field"] == "body.allow_tools.1"
    assert problem["code"] == "invalid_parameters"
    assert (await http.get(f"/v1/policies/{t}", headers=admin)).status_code == 404


async def test_bad_tenant_path_is_422(http: httpx.AsyncClient, auth: Auth) -> None:
    response = await http.get("/v1/policies/bad%20tenant", headers=auth("ops", admin=True))
    assert response.status_code == 422


async def test_catalog_shows_only_allowed_tools(http: httpx.AsyncClient, auth: Auth) -> None:
    t, admin = tenant(), auth("ops", admin=True)
    caller = auth(t)
    nothing = (await http.get("/v1/tools", headers=caller)).json()
    assert nothing["items"] == []
    assert nothing["total"] == 0
    assert (await http.get("/v1/tools/core__echo", headers=caller)).status_code == 404

    policy = {
        "allow_tools": ["core__*"],
        "deny_tools": ["core__long_running", "core__run_python"],
        "agents": {"did:agent:intern": {"allow_tools": ["core__echo"]}},
    }
    assert (await http.put(f"/v1/policies/{t}", json=policy, headers=admin)).status_code == 200
    listing = (await http.get("/v1/tools", headers=caller)).json()
    assert [i["tool_id"] for i in listing["items"]] == ["core__echo", "core__get_current_time"]
    assert listing["total"] == 2
    paged = (await http.get("/v1/tools", params={"page_size": 1, "page": 2}, headers=caller)).json()
    assert [i["tool_id"] for i in paged["items"]] == ["core__get_current_time"]
    assert (await http.get("/v1/tools/core__echo", headers=caller)).status_code == 200
    hidden = await http.get("/v1/tools/core__long_running", headers=caller)
    assert hidden.status_code == 404
    assert hidden.json()["code"] == "tool_not_found"

    intern = auth(t, agent="did:agent:intern")
    narrowed = (await http.get("/v1/tools", headers=intern)).json()
    assert [i["tool_id"] for i in narrowed["items"]] == ["core__echo"]

    everything = (await http.get("/v1/tools", headers=admin)).json()
    assert {"core__echo", "core__long_running"} <= {i["tool_id"] for i in everything["items"]}
    assert (await http.get("/v1/tools/core__long_running", headers=admin)).status_code == 200


async def test_catalog_follows_a_policy_change_at_once(http: httpx.AsyncClient, auth: Auth) -> None:
    t, admin = tenant(), auth("ops", admin=True)
    await http.put(f"/v1/policies/{t}", json={"allow_tools": ["core__echo"]}, headers=admin)
    assert (await http.get("/v1/tools/core__echo", headers=auth(t))).status_code == 200
    await http.put(f"/v1/policies/{t}", json={"allow_tools": ["core__get_*"]}, headers=admin)
    assert (await http.get("/v1/tools/core__echo", headers=auth(t))).status_code == 404
