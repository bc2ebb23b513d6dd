"""What a token opened ends with the token, and what it lists is what it may call
(issue 32, attack 5 and "catalogs honour the token"; contract section 9).

An API served by uvicorn (real streaming) in front of a whole in-process fleet (real
broker, Redis, Postgres): Server-Sent Events streams and a long MCP call opened before
a revocation, or with a token about to expire, end with ``stream_closed`` within a
second; a ``core__echo`` token's catalogs (HTTP, search, MCP ``tools/list``, the agent
runner's) list ``core__echo`` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import httpx2
import jwt
import pytest
import uvicorn
from fastapi import FastAPI
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.support.api import bearer
from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from tests.support.servers import free_port
from toolfleet.agent import HttpFleet, ToolRunner
from toolfleet.api import ApiSettings, create_app
from toolfleet.api.resources import ApiResources
from toolfleet.settings import FleetSettings
from toolfleet.storage.redis import connect_redis
from toolfleet.storage.revocation import RedisRevocationList
from toolfleet.worker import SERVICES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

AGENT = "did:agent:bound"
WITHIN_S = 1.0
"""Contract section 9: a stream ends within a second of its token's revocation."""


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("bound-fleet")
    async with in_process_fleet(fleet_settings(settings, home), SERVICES) as running:
        yield running


@dataclass(frozen=True)
class Api:
    url: str
    app: FastAPI

    @property
    def res(self) -> ApiResources:
        res: ApiResources = self.app.state.resources
        return res


@pytest.fixture(scope="module")
async def api(fleet: Fleet) -> AsyncIterator[Api]:
    """An API replica of ``fleet`` served by uvicorn, following revocations."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    app = create_app(ApiSettings(**{**fleet.settings.model_dump(), "api_url": url}))
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    task = asyncio.create_task(server.serve())

    async def listening() -> bool:
        assert not task.done(), "uvicorn stopped"
        return server.started and app.state.resources.revocations.is_live

    await eventually(listening, timeout=30)
    try:
        yield Api(url=url, app=app)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


def tenant() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


async def revoke(fleet: Fleet, token: str) -> None:
    """``toolfleet token revoke``, as an operator runs it from another process."""
    jti = jwt.decode(token, options={"verify_signature": False})["jti"]
    redis = connect_redis(fleet.settings.redis_url)
    try:
        await RedisRevocationList(redis).revoke(jti, ttl_s=600)
    finally:
        await redis.aclose()


async def running_call(api: Api, owner: str) -> uuid.UUID:
    """A call of ``owner`` that runs and never changes (its stream only waits)."""
    invocation_id = uuid.uuid4()
    await api.res.pool.execute(
        "INSERT INTO tool_invocations (invocation_id, tenant_id, tool_id, status, status_rank, "
        "progress_percent, current_phase, created_at) "
        "VALUES ($1, $2, 'core__long_running', 'running', 2, 10, 'step 1', $3)",
        invocation_id,
        owner,
        datetime.now(UTC),
    )
    return invocation_id


async def stream_path(api: Api, which: str, owner: str) -> str:
    if which == "invocation":
        return f"/v1/invocations/{await running_call(api, owner)}/events"
    return "/v1/events/invocations"  # the console's live feed


async def events(response: httpx.Response) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """``(event, data)`` of each SSE event, until the server closes the stream."""
    name = "message"
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            yield name, json.loads(line[len("data: ") :])


async def rest_of(seen: AsyncIterator[tuple[str, dict[str, Any]]]) -> list[tuple[str, Any]]:
    return [event async for event in seen]


# --- streams end with their credential -----------------------------------------------


@pytest.mark.parametrize("which", ["invocation", "feed"])
async def test_an_open_stream_ends_within_a_second_of_its_tokens_revocation(
    fleet: Fleet, api: Api, which: str
) -> None:
    owner = tenant()
    token = fleet.token(owner, AGENT)
    path = await stream_path(api, which, owner)
    async with (
        httpx.AsyncClient(base_url=api.url, timeout=10) as http,
        http.stream("GET", path, headers=bearer(token)) as response,
    ):
        assert response.status_code == 200
        seen = events(response)
        first, _ = await anext(seen)  # the stream is open and serving
        assert first in {"tool_call_start", "snapshot"}

        await revoke(fleet, token)
        revoked_at = time.monotonic()
        rest = await asyncio.wait_for(rest_of(seen), 5)  # old code: never ends
        took = time.monotonic() - revoked_at

    assert rest, "the stream closed without saying why"
    name, data = rest[-1]
    assert (name, data["reason"]) == ("stream_closed", "token_revoked")
    assert took < WITHIN_S, f"closed {took:.2f} s after the revocation"

    async def released() -> bool:
        return api.res.feed.subscribers == 0  # the feed's follower is gone with it

    assert await eventually(released, timeout=5)


@pytest.mark.parametrize("which", ["invocation", "feed"])
async def test_an_open_stream_ends_at_its_tokens_expiry(fleet: Fleet, api: Api, which: str) -> None:
    owner = tenant()
    token = fleet.token(owner, AGENT, ttl_s=2)
    expires_at = jwt.decode(token, options={"verify_signature": False})["exp"]
    path = await stream_path(api, which, owner)
    async with (
        httpx.AsyncClient(base_url=api.url, timeout=10) as http,
        http.stream("GET", path, headers=bearer(token)) as response,
    ):
        assert response.status_code == 200
        seen = events(response)
        await anext(seen)
        assert time.time() < expires_at, "the machine is too slow for this test's token"
        rest = await asyncio.wait_for(rest_of(seen), 6)  # old code: never ends
        ended_at = time.time()

    name, data = rest[-1]
    assert (name, data["reason"]) == ("stream_closed", "token_expired")
    assert expires_at <= ended_at < expires_at + WITHIN_S


@contextlib.asynccontextmanager
async def mcp_client(api: Api, token: str) -> AsyncIterator[Client]:
    timeout = httpx2.Timeout(30, read=120)
    async with (
        httpx2.AsyncClient(headers=bearer(token), timeout=timeout) as http,
        Client(streamable_http_client(f"{api.url}/mcp", http_client=http)) as client,
    ):
        yield client


async def test_a_long_mcp_call_ends_within_a_second_of_its_tokens_revocation(
    fleet: Fleet, api: Api
) -> None:
    token = fleet.token(tenant(), AGENT)
    started = asyncio.Event()

    async def progress(value: float, total: float | None, message: str | None) -> None:
        started.set()

    async with mcp_client(api, token) as client:
        call = asyncio.create_task(
            client.call_tool(
                "core__long_running",
                {"steps": 40, "step_seconds": 0.2},
                progress_callback=progress,
            )
        )
        await asyncio.wait_for(started.wait(), 30)  # running, and heard of

        await revoke(fleet, token)
        revoked_at = time.monotonic()
        result = await asyncio.wait_for(call, 5)  # old code: follows the call to its end
        took = time.monotonic() - revoked_at

    assert result.is_error
    error = (result.structured_content or {})["error"]
    assert (error["code"], error["reason"]) == ("permission_denied", "token_revoked")
    assert "revoked" in result.content[0].text  # type: ignore[union-attr]
    assert took < WITHIN_S, f"answered {took:.2f} s after the revocation"


async def test_a_long_mcp_call_ends_at_its_tokens_expiry(fleet: Fleet, api: Api) -> None:
    token = fleet.token(tenant(), AGENT, ttl_s=3)
    expires_at = jwt.decode(token, options={"verify_signature": False})["exp"]
    async with mcp_client(api, token) as client:
        result = await asyncio.wait_for(  # old code: follows the call to its end (8 s)
            client.call_tool("core__long_running", {"steps": 40, "step_seconds": 0.2}), 7
        )
        ended_at = time.time()

    assert result.is_error
    error = (result.structured_content or {})["error"]
    assert (error["code"], error["reason"]) == ("permission_denied", "token_expired")
    assert expires_at <= ended_at < expires_at + WITHIN_S


# --- catalogs honour the token -------------------------------------------------------


async def test_a_narrow_tokens_catalogs_list_only_its_tools(fleet: Fleet, api: Api) -> None:
    owner = tenant()  # the default policy allows it core__* and test__*
    broad = fleet.token(owner, AGENT)
    narrow = fleet.token(owner, AGENT, tool="core__echo")
    async with httpx.AsyncClient(base_url=api.url, timeout=30) as http:
        everything = (await http.get("/v1/tools", headers=bearer(broad))).json()
        assert everything["total"] > 1  # the policy alone shows more

        listed = (await http.get("/v1/tools", headers=bearer(narrow))).json()
        searched = await http.get(
            "/v1/tools", params={"q": "sleep for a while", "min_score": -1}, headers=bearer(narrow)
        )
        echo = await http.get("/v1/tools/core__echo", headers=bearer(narrow))
        other = await http.get("/v1/tools/core__long_running", headers=bearer(narrow))
    assert [t["tool_id"] for t in listed["items"]] == ["core__echo"]
    assert listed["total"] == 1
    assert [t["tool_id"] for t in searched.json()["items"]] == ["core__echo"]
    assert echo.status_code == 200
    assert other.status_code == 404

    async with mcp_client(api, narrow) as client:
        assert [t.name for t in (await client.list_tools()).tools] == ["core__echo"]

    async with HttpFleet.open(api.url, token=narrow, tenant_id=owner, agent_did=AGENT) as port:
        runner = await ToolRunner.open(port, run_id=f"run-{uuid.uuid4().hex[:8]}")
    assert runner.catalog.names == ["core__echo"]
