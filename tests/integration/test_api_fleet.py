"""The HTTP API in front of a whole in-process fleet (real broker, Redis, Postgres):
synchronous invokes, and text Postgres refuses, shown as sent."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.support.api import BASE_URL
from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.api import ApiSettings
from toolfleet.client import connect_http
from toolfleet.events.types import TopicName
from toolfleet.settings import FleetSettings
from toolfleet.status.projection import InvocationRow
from toolfleet.status.store import PostgresProjection
from toolfleet.worker import SERVICES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

AGENT = "did:agent:sync"
#: Far longer than any wait below: a synchronous invoke that returns sooner was woken
#: by status's notice, not by the periodic recheck.
RECHECK_S = 45.0


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("api-fleet")
    async with in_process_fleet(fleet_settings(settings, home), SERVICES) as running:
        yield running


@pytest.fixture(scope="module")
def api_settings(fleet: Fleet) -> ApiSettings:
    return ApiSettings(
        **{
            **fleet.settings.model_dump(),
            "api_url": BASE_URL,
            "sync_invoke_wait_s": 20,
            "sync_invoke_recheck_s": RECHECK_S,
        }
    )


def tenant() -> str:
    return f"t_{uuid.uuid4().hex[:10]}"


def headers(fleet: Fleet, owner: str, **extra: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {fleet.token(owner, AGENT)}", **extra}


def body(owner: str, tool_id: str, parameters: dict[str, Any], **extra: Any) -> bytes:
    request = {
        "tool_id": tool_id,
        "agent_context": {"agent_did": AGENT, "tenant_id": owner},
        "parameters": parameters,
        **extra,
    }
    return json.dumps(request).encode()  # ASCII escapes: lone surrogates travel too


async def invoke_and_wait(
    fleet: Fleet, http: httpx.AsyncClient, owner: str, message: str
) -> dict[str, Any]:
    """POST an echo of ``message``; its status view once it has ended."""
    posted = await http.post(
        "/v1/invocations",
        content=body(owner, "core__echo", {"message": message}),
        headers=headers(fleet, owner, **{"Content-Type": "application/json"}),
    )
    assert posted.status_code == 202
    invocation_id = posted.json()["invocation_id"]

    async def ended() -> dict[str, Any] | None:
        got = await http.get(f"/v1/invocations/{invocation_id}", headers=headers(fleet, owner))
        view: dict[str, Any] = got.json()
        return view if got.status_code == 200 and view["completed_at"] else None

    return await eventually(ended, timeout=60)


async def projected_parameters(projection: PostgresProjection, invocation_id: str) -> InvocationRow:
    """The call's row once its request is projected. Status folds a call's events as they
    arrive, from several topics: the outcome of a call refused at once can be folded
    before its request, so the row may show the outcome a moment before the parameters."""

    async def with_parameters() -> InvocationRow | None:
        row = await projection.get(invocation_id)
        return row if row is not None and row.parameters is not None else None

    return await eventually(with_parameters, timeout=30)


async def test_text_postgres_refuses_is_shown_as_sent(
    fleet: Fleet, app: FastAPI, http: httpx.AsyncClient
) -> None:
    owner = tenant()
    projection = PostgresProjection(app.state.resources.pool)

    # NUL, and the character the store escapes with: the call succeeds and shows as sent.
    message = "nul\x00 escape\ue000 \ue0000000"
    view = await invoke_and_wait(fleet, http, owner, message)
    assert view["status"] == "success"
    assert view["result"] == {"message": message, "length": len(message)}
    listed = await http.get("/v1/invocations", headers=headers(fleet, owner))
    assert [item["result"] for item in listed.json()["items"]] == [view["result"]]
    row = await projected_parameters(projection, view["invocation_id"])
    assert row.parameters == {"message": message}

    # A lone surrogate (valid in a JSON escape, not in UTF-8): the tool's input model
    # refuses it, and status still shows the call with its parameters as sent.
    lone = "lone\ud800 tail\udfff"
    view = await invoke_and_wait(fleet, http, owner, lone)
    assert view["status"] == "error"
    assert view["error"]["code"] == "invalid_parameters"
    row = await projected_parameters(projection, view["invocation_id"])
    assert row.parameters == {"message": lone}

    dead = [e for e in await fleet.read(TopicName.DLQ) if e.tenantid == owner]
    assert dead == []


async def test_async_mode_false_answers_200_with_the_outcome(
    fleet: Fleet, http: httpx.AsyncClient
) -> None:
    owner = tenant()
    started = time.monotonic()
    response = await http.post(
        "/v1/invocations",
        content=body(
            owner, "core__echo", {"message": "hi"}, execution_options={"async_mode": False}
        ),
        headers=headers(fleet, owner, **{"Content-Type": "application/json"}),
    )
    elapsed = time.monotonic() - started
    assert response.status_code == 200, response.text
    outcome = response.json()
    assert outcome["status"] == "success"
    assert outcome["result"] == {"message": "hi", "length": 2}
    assert outcome["tool_version"] == "1.0.0"
    assert outcome["completed_at"] is not None
    assert "Preference-Applied" not in response.headers
    assert elapsed < RECHECK_S / 2  # woken by the notice, not by a recheck


async def test_prefer_wait_answers_200_and_says_it_applied(
    fleet: Fleet, http: httpx.AsyncClient
) -> None:
    owner = tenant()
    response = await http.post(
        "/v1/invocations",
        content=body(owner, "core__echo", {"message": "prefer"}),
        headers=headers(fleet, owner, **{"Content-Type": "application/json", "Prefer": "wait=600"}),
    )
    assert response.status_code == 200, response.text
    assert response.headers["Preference-Applied"] == "wait=60"  # capped
    assert response.json()["result"] == {"message": "prefer", "length": 6}


async def test_slow_call_answers_202_after_the_wait(fleet: Fleet, http: httpx.AsyncClient) -> None:
    owner = tenant()
    started = time.monotonic()
    response = await http.post(
        "/v1/invocations",
        content=body(owner, "core__long_running", {"steps": 4, "step_seconds": 1.0}),
        headers=headers(fleet, owner, **{"Content-Type": "application/json", "Prefer": "wait=1"}),
    )
    elapsed = time.monotonic() - started
    assert response.status_code == 202, response.text
    assert response.headers["Preference-Applied"] == "wait=1"
    assert elapsed >= 1
    accepted = response.json()
    assert accepted["status"] == "pending"

    async def finished() -> bool:
        got = await http.get(
            f"/v1/invocations/{accepted['invocation_id']}", headers=headers(fleet, owner)
        )
        return got.status_code == 200 and got.json()["status"] == "success"

    await eventually(finished, timeout=60)


async def test_sdk_http_client_call_returns_the_outcome(fleet: Fleet, app: FastAPI) -> None:
    owner = tenant()
    async with connect_http(
        "http://api.test", token=fleet.token(owner, AGENT), transport=httpx.ASGITransport(app=app)
    ) as client:
        started = time.monotonic()
        outcome = await client.call(
            "core__echo", {"message": "sdk\x00"}, tenant_id=owner, agent_did=AGENT, timeout=30
        )
    assert outcome.status == "success"
    assert outcome.result == {"message": "sdk\x00", "length": 4}
    assert time.monotonic() - started < RECHECK_S / 2  # one synchronous request
