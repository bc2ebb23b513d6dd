"""The HTTP API refuses a revoked token on every route, and fails closed without Redis."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator

import httpx
import jwt
import pytest
from fastapi import FastAPI

from tests.support.api import ApiKeys, api_settings_for, bearer, running_app
from tests.support.eventually import eventually
from toolfleet.api import ApiSettings
from toolfleet.api.resources import ApiResources
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.executor.registration import register_catalog
from toolfleet.registry.catalog import discover
from toolfleet.settings import FleetSettings
from toolfleet.storage.redis import connect_redis
from toolfleet.storage.revocation import CachedRevocationList, RedisRevocationList

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"
POLICY = {"allow_tools": ["core__*"]}


@pytest.fixture(scope="module")
def api_settings(settings: FleetSettings, api_keys: ApiKeys) -> ApiSettings:
    # A long cache TTL: a refusal within the test's bounds came through the push.
    return api_settings_for(settings, api_keys, revocation_cache_ttl_s=300)


@pytest.fixture(scope="module")
async def app(api_settings: ApiSettings) -> AsyncIterator[FastAPI]:
    async with running_app(api_settings) as application:
        res: ApiResources = application.state.resources
        await register_catalog(res.pool, discover([]))

        async def listening() -> bool:
            return res.revocations.is_live

        await eventually(listening, timeout=10)
        yield application


async def revoke(settings: ApiSettings, token: str, http: httpx.AsyncClient) -> None:
    """``toolfleet token revoke``, as an operator would run it from another process;
    returns once the API refuses the token (within a second: pushed, not the TTL)."""
    jti = jwt.decode(token, options={"verify_signature": False})["jti"]
    redis = connect_redis(settings.redis_url)
    try:
        await RedisRevocationList(redis).revoke(jti, ttl_s=600)
    finally:
        await redis.aclose()

    async def refused() -> bool:
        response = await http.get("/v1/tools", headers=bearer(token))
        return response.status_code == 401

    await eventually(refused, timeout=1.0, interval=0.01)


def tenant() -> str:
    return f"tenant_{uuid.uuid4().hex[:10]}"


async def test_a_revoked_token_is_refused_on_every_read_route(
    http: httpx.AsyncClient, issuer: TokenIssuer, api_settings: ApiSettings
) -> None:
    token = issuer.issue(tenant_id=tenant(), agent_did="did:agent:a")
    missing = uuid.uuid4()
    routes = [
        "/v1/invocations",
        f"/v1/invocations/{missing}",
        f"/v1/invocations/{missing}/attachments/{uuid.uuid4()}",
        "/v1/tools",
        "/v1/tools/core__echo",
    ]
    before = {route: (await http.get(route, headers=bearer(token))).status_code for route in routes}
    assert 401 not in before.values(), before  # cached as "not revoked" from here on

    await revoke(api_settings, token, http)

    for route in routes:
        response = await http.get(route, headers=bearer(token))
        assert response.status_code == 401, route
        assert response.headers["content-type"] == PROBLEM
        assert response.headers["www-authenticate"] == 'Bearer error="invalid_token"'
        problem = response.json()
        assert problem["code"] == "permission_denied"
        assert "revoked" in problem["detail"]
        assert token not in response.text
    other = issuer.issue(tenant_id=tenant(), agent_did="did:agent:a")
    assert (await http.get("/v1/invocations", headers=bearer(other))).status_code == 200


async def test_a_revoked_admin_token_cannot_write_policy(
    http: httpx.AsyncClient, issuer: TokenIssuer, api_settings: ApiSettings
) -> None:
    admin = issuer.issue(tenant_id="ops", agent_did="did:agent:ops", scopes=["admin"])
    target = tenant()
    written = await http.put(f"/v1/policies/{target}", json=POLICY, headers=bearer(admin))
    assert written.status_code == 200, written.text

    await revoke(api_settings, admin, http)

    for response in (
        await http.put(f"/v1/policies/{target}", json=POLICY, headers=bearer(admin)),
        await http.get(f"/v1/policies/{target}", headers=bearer(admin)),
        await http.post(
            "/v1/invocations",
            json={
                "tool_id": "core__echo",
                "parameters": {"message": "x"},
                "agent_context": {"tenant_id": "ops", "agent_did": "did:agent:ops"},
            },
            headers=bearer(admin),
        ),
        await http.post(f"/v1/invocations/{uuid.uuid4()}/cancel", headers=bearer(admin)),
        await http.post(f"/v1/invocations/{uuid.uuid4()}/approve", headers=bearer(admin)),
    ):
        assert response.status_code == 401, response.request.url
        assert response.json()["code"] == "permission_denied"


async def test_an_unreachable_revocation_list_is_a_503_not_a_pass(
    app: FastAPI, http: httpx.AsyncClient, issuer: TokenIssuer
) -> None:
    res: ApiResources = app.state.resources
    dead_redis = connect_redis("redis://127.0.0.1:9/0", wait_s=1)
    app.state.resources = dataclasses.replace(
        res, revocations=CachedRevocationList(RedisRevocationList(dead_redis))
    )
    token = issuer.issue(tenant_id=tenant(), agent_did="did:agent:a")
    try:
        response = await http.get("/v1/invocations", headers=bearer(token))
    finally:
        app.state.resources = res
        await dead_redis.aclose()
    assert response.status_code == 503
    assert response.headers["content-type"] == PROBLEM
    assert response.headers["retry-after"] == "1"
    assert "revocation" in response.json()["detail"]
    assert (await http.get("/v1/invocations", headers=bearer(token))).status_code == 200
