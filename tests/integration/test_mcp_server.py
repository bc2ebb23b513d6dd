"""toolfleet as an MCP server: the ``mcp`` SDK's client against ``/mcp`` of an API served
by uvicorn, in front of a whole in-process fleet (real broker, Redis, Postgres)."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jwt
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.eventually import eventually
from tests.support.pipeline import DEFAULT_POLICY, Fleet, fleet_settings, in_process_fleet
from tests.support.servers import served_by_uvicorn
from toolfleet.api import ApiSettings, create_app
from toolfleet.api.mcp.results import HANDLE_SCHEMA
from toolfleet.registry.store import RegistryStore
from toolfleet.settings import FleetSettings
from toolfleet.storage.redis import connect_redis
from toolfleet.storage.revocation import RedisRevocationList
from toolfleet.worker import SERVICES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

AGENT = "did:agent:mcp"
ECHO_ONLY = "mcp_echo_only"
APPROVAL = "mcp_approval"
POLICY: dict[str, Any] = {
    "tenants": {
        **DEFAULT_POLICY["tenants"],
        ECHO_ONLY: {"allow_tools": ["core__echo"]},
        APPROVAL: {"allow_tools": ["core__*"], "approval_effects": ["read_only"]},
    }
}
INVOCATION = "io.toolfleet/invocation_id"


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("mcp-fleet")
    async with in_process_fleet(fleet_settings(settings, home, policy=POLICY), SERVICES) as running:
        yield running


@contextlib.asynccontextmanager
async def serve_api(fleet: Fleet) -> AsyncIterator[str]:
    """An API replica of ``fleet`` served by uvicorn on a free port; yields its base URL."""
    settings = fleet.settings.model_dump()
    async with served_by_uvicorn(
        lambda url: create_app(ApiSettings(**{**settings, "api_url": url}))
    ) as url:
        yield url


@pytest.fixture(scope="module")
async def api(fleet: Fleet) -> AsyncIterator[str]:
    async with serve_api(fleet) as url:
        yield url


@contextlib.asynccontextmanager
async def mcp_client(
    api: str, token: str, *, mode: str = "auto", transport: httpx2.AsyncBaseTransport | None = None
) -> AsyncIterator[Client]:
    """An MCP client of the SDK connected to ``/mcp`` with ``token`` as bearer."""
    headers = {"Authorization": f"Bearer {token}"}
    timeout = httpx2.Timeout(30, read=120)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout, transport=transport) as http,
        Client(streamable_http_client(f"{api}/mcp", http_client=http), mode=mode) as client,
    ):
        yield client


def tenant() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


async def status(api: str, token: str, invocation_id: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=api) as http:
        return await http.get(
            f"/v1/invocations/{invocation_id}", headers={"Authorization": f"Bearer {token}"}
        )


async def registered(fleet: Fleet, *patterns: str) -> dict[str, dict[str, Any]]:
    """Registered tools matching ``patterns``: id -> newest live manifest (as JSON)."""
    from toolfleet.storage.postgres import create_pool

    pool = await create_pool(fleet.settings.database_url)
    try:
        store = RegistryStore(pool)
        rows, _ = await store.list_tools(limit=1000)
        found = {}
        for row in rows:
            tool_id = str(row["tool_id"])
            live = [m for m in await store.versions(tool_id) if m.lifecycle_state != "removed"]
            if live and any(fnmatch.fnmatchcase(tool_id, p) for p in patterns):
                found[tool_id] = live[0].model_dump(mode="json")
        return found
    finally:
        await pool.close()


# --- the door ----------------------------------------------------------------------------


async def test_mcp_needs_a_valid_unrevoked_bearer_token(fleet: Fleet, api: str) -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/list",
        "params": {},
    }
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(base_url=api) as http:
        missing = await http.post("/mcp", json=initialize, headers=accept)
        forged = await http.post(
            "/mcp", json=initialize, headers={**accept, "Authorization": "Bearer not.a.jwt"}
        )
    for answer in (missing, forged):
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"].startswith("Bearer")
        assert answer.headers["content-type"] == "application/problem+json"
    assert "not.a.jwt" not in forged.text

    token = fleet.token(tenant(), AGENT)
    async with mcp_client(api, token) as client:
        assert (await client.list_tools()).tools
    jti = jwt.decode(token, options={"verify_signature": False})["jti"]
    redis = connect_redis(fleet.settings.redis_url)
    try:
        await RedisRevocationList(redis).revoke(jti, ttl_s=600)
    finally:
        await redis.aclose()

    async def refused() -> bool | None:
        async with httpx.AsyncClient(base_url=api) as http:
            answer = await http.post(
                "/mcp", json=initialize, headers={**accept, "Authorization": f"Bearer {token}"}
            )
        return True if answer.status_code == 401 else None

    assert await eventually(refused, timeout=10)


# --- tools/list ---------------------------------------------------------------------------


async def test_tools_list_is_exactly_the_tenants_allowed_catalog(fleet: Fleet, api: str) -> None:
    expected = await registered(fleet, "core__*", "test__*")  # the "*" policy
    async with mcp_client(api, fleet.token(tenant(), AGENT)) as client:
        listed = (await client.list_tools()).tools
    assert sorted(t.name for t in listed) == sorted(expected)
    for tool in listed:
        manifest = expected[tool.name]
        assert tool.input_schema == manifest["input_schema"]
        assert tool.output_schema is not None
        assert tool.output_schema["type"] == "object"
        inner, handle = tool.output_schema["anyOf"]
        assert handle == HANDLE_SCHEMA
        assert {
            **inner,
            **{k: tool.output_schema[k] for k in ("$defs",) if k in tool.output_schema},
        } == {k: v for k, v in manifest["output_schema"].items() if k != "$schema"}

    async with mcp_client(api, fleet.token(ECHO_ONLY, AGENT)) as client:
        assert [t.name for t in (await client.list_tools()).tools] == ["core__echo"]


# --- tools/call ---------------------------------------------------------------------------


async def test_a_call_runs_through_the_fleet_and_another_tenant_sees_nothing(
    fleet: Fleet, api: str
) -> None:
    owner, other = tenant(), ECHO_ONLY
    async with mcp_client(api, fleet.token(owner, AGENT)) as client:
        result = await client.call_tool("core__echo", {"message": "hello mcp"})
    assert not result.is_error
    assert result.structured_content == {"message": "hello mcp", "length": 9}
    assert json.loads(result.content[0].text) == result.structured_content  # type: ignore[union-attr]
    assert result.meta is not None
    invocation_id = result.meta[INVOCATION]

    mine = await status(api, fleet.token(owner, AGENT), invocation_id)
    assert mine.status_code == 200
    assert mine.json()["status"] == "success"
    assert mine.json()["tenant_id"] == owner

    # The other tenant: its catalog holds only its own tool, the call is invisible.
    theirs = fleet.token(other, AGENT)
    assert (await status(api, theirs, invocation_id)).status_code == 404
    async with httpx.AsyncClient(base_url=api) as http:
        listed = await http.get("/v1/invocations", headers={"Authorization": f"Bearer {theirs}"})
    assert invocation_id not in {item["invocation_id"] for item in listed.json()["items"]}
    async with mcp_client(api, theirs) as client:
        denied = await client.call_tool("core__long_running", {"steps": 1, "step_seconds": 0})
    assert denied.is_error
    assert denied.structured_content["error"]["code"] == "permission_denied"  # type: ignore[index]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_long_call_reports_progress_from_its_checkpoints(
    fleet: Fleet, api: str, mode: str
) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, total, message))

    async with mcp_client(api, fleet.token(tenant(), AGENT), mode=mode) as client:
        result = await client.call_tool(
            "core__long_running",
            {"steps": 3, "step_seconds": 0.6},
            progress_callback=progress,
        )
    assert not result.is_error, result
    assert result.structured_content == {"steps_completed": 3, "resumed_from_step": None}
    assert seen, "no progress notification arrived"
    values = [value for value, _, _ in seen]
    assert values == sorted(values)
    assert all(total == 100.0 for _, total, _ in seen)
    assert {message for _, _, message in seen} & {"step 1/3", "step 2/3", "step 3/3"}


async def test_invalid_arguments_answer_is_error_with_the_validation_message(
    fleet: Fleet, api: str
) -> None:
    async with mcp_client(api, fleet.token(tenant(), AGENT)) as client:
        result = await client.call_tool("core__echo", {"text": "no message field"})
    assert result.is_error
    error = result.structured_content["error"]  # type: ignore[index]
    assert error["code"] == "invalid_parameters"
    assert error["message"] == "parameters do not match the input schema of core__echo@1.0.0"
    text = result.content[0].text  # type: ignore[union-attr]
    assert text.startswith("invalid_parameters: parameters do not match")
    assert '"message" is a required property' in text

    async with mcp_client(api, fleet.token(tenant(), AGENT)) as client:
        unknown = await client.call_tool("core__no_such_tool", {})
    assert unknown.is_error
    assert unknown.structured_content["error"]["code"] == "tool_not_found"  # type: ignore[index]


async def test_an_idempotency_key_in_meta_works_as_in_the_http_api(fleet: Fleet, api: str) -> None:
    meta = {"io.toolfleet/idempotency_key": f"k-{uuid.uuid4().hex}"}
    async with mcp_client(api, fleet.token(tenant(), AGENT)) as client:
        first = await client.call_tool("core__echo", {"message": "once"}, meta=meta)
        again = await client.call_tool("core__echo", {"message": "once"}, meta=meta)
        other = await client.call_tool("core__echo", {"message": "twice"}, meta=meta)
    assert first.structured_content == again.structured_content == {"message": "once", "length": 4}
    assert other.is_error
    assert other.structured_content["error"]["code"] == "idempotency_conflict"  # type: ignore[index]


async def test_a_call_needing_approval_answers_with_a_handle_to_poll(
    fleet: Fleet, api: str
) -> None:
    token = fleet.token(APPROVAL, AGENT)
    async with mcp_client(api, token) as client:
        result = await client.call_tool("core__echo", {"message": "may I?"})
    assert not result.is_error
    handle = result.structured_content
    assert handle is not None
    assert handle["status"] == "pending_approval"
    assert handle["poll"] == f"/v1/invocations/{handle['invocation_id']}"
    assert "waiting for approval" in result.content[0].text  # type: ignore[union-attr]
    polled = await status(api, token, handle["invocation_id"])
    assert polled.status_code == 200
    assert polled.json()["status"] == "pending_approval"


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_client_cancel_cancels_the_invocation(fleet: Fleet, api: str, mode: str) -> None:
    owner = tenant()
    token = fleet.token(owner, AGENT)
    started = asyncio.Event()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        started.set()

    async with mcp_client(api, token, mode=mode) as client:
        call = asyncio.create_task(
            client.call_tool(
                "core__long_running",
                {"steps": 200, "step_seconds": 0.2},
                progress_callback=progress,
            )
        )
        await asyncio.wait_for(started.wait(), 30)
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call

    async def cancelled() -> dict[str, Any] | None:
        async with httpx.AsyncClient(base_url=api) as http:
            listed = await http.get("/v1/invocations", headers={"Authorization": f"Bearer {token}"})
        items = listed.json()["items"]
        return items[0] if items and items[0]["status"] == "cancelled" else None

    view = await eventually(cancelled, timeout=30)
    assert view["tool_id"] == "core__long_running"


class SplitReplicas(httpx2.AsyncBaseTransport):
    """A load balancer without sticky sessions: ``tools/call`` requests go to one
    replica, every other request (initialize, notifications, cancels) to the other."""

    def __init__(self, calls: str, rest: str) -> None:
        self.calls, self.rest = httpx2.URL(calls), httpx2.URL(rest)
        self.inner = httpx2.AsyncHTTPTransport()
        self.served: list[tuple[str, int | None]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = await request.aread()
        method = str(json.loads(body).get("method")) if body else request.method
        target = self.calls if method == "tools/call" else self.rest
        request.url = request.url.copy_with(port=target.port)
        self.served.append((method, target.port))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_replicas_need_no_sticky_sessions(fleet: Fleet, api: str) -> None:
    """Handshake on one replica, calls on another, the cancel back on the first."""
    owner = tenant()
    token = fleet.token(owner, AGENT)
    started = asyncio.Event()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        started.set()

    async with serve_api(fleet) as other:
        balancer = SplitReplicas(calls=api, rest=other)
        async with mcp_client(api, token, mode="legacy", transport=balancer) as client:
            echoed = await client.call_tool("core__echo", {"message": "anywhere"})
            assert echoed.structured_content == {"message": "anywhere", "length": 8}
            call = asyncio.create_task(
                client.call_tool(
                    "core__long_running",
                    {"steps": 200, "step_seconds": 0.2},
                    progress_callback=progress,
                )
            )
            await asyncio.wait_for(started.wait(), 30)
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call

            async def cancelled() -> bool | None:
                async with httpx.AsyncClient(base_url=api) as http:
                    listed = await http.get(
                        "/v1/invocations", headers={"Authorization": f"Bearer {token}"}
                    )
                items = listed.json()["items"]
                return True if items and items[0]["status"] == "cancelled" else None

            assert await eventually(cancelled, timeout=30)
    ports = dict(balancer.served)
    assert ports["initialize"] == ports["notifications/cancelled"] != ports["tools/call"]
