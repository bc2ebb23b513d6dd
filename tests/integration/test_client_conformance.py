"""One set of tests, bound to both transports: ``connect_http`` and ``connect_kafka``
behave the same against a real in-process fleet (broker, Redis, Postgres, every
service, the API). What a transport cannot do is one typed error, asserted here too."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from tests.support.api import BASE_URL
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.api import ApiSettings
from toolfleet.client import (
    ApiError,
    Client,
    InvocationEvent,
    NotSupportedByTransport,
    connect_http,
    connect_kafka,
)
from toolfleet.contract.progress import EventKind
from toolfleet.errors import ToolfleetError
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.settings import FleetSettings
from toolfleet.worker import SERVICES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

AGENT = "did:agent:conformance"
TRANSPORTS = ["http", "kafka"]


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("conformance")
    async with in_process_fleet(fleet_settings(settings, home), SERVICES) as running:
        yield running


@pytest.fixture(scope="module")
def api_settings(fleet: Fleet) -> ApiSettings:
    return ApiSettings(**{**fleet.settings.model_dump(), "api_url": BASE_URL})


@dataclass(frozen=True)
class Opened:
    client: Client
    transport: str
    tenant_id: str


@pytest.fixture(params=TRANSPORTS)
async def opened(
    request: pytest.FixtureRequest, fleet: Fleet, app: FastAPI
) -> AsyncIterator[Opened]:
    """A client of a fresh tenant, over the transport the test is bound to."""
    owner = f"t_{uuid.uuid4().hex[:10]}"
    token = fleet.token(owner, AGENT)
    async with contextlib.AsyncExitStack() as stack:
        if request.param == "http":
            client: Client = await stack.enter_async_context(
                connect_http(BASE_URL, token=token, transport=httpx.ASGITransport(app=app))
            )
        else:
            client = await stack.enter_async_context(
                connect_kafka(fleet.settings, tenant_id=owner, token=token)
            )
        yield Opened(client=client, transport=request.param, tenant_id=owner)


async def test_call_returns_the_outcome(opened: Opened) -> None:
    outcome = await opened.client.call(
        "core__echo", {"message": "hi"}, tenant_id=opened.tenant_id, agent_did=AGENT, timeout=60
    )
    assert isinstance(outcome, ToolOutcome)
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result == {"message": "hi", "length": 2}
    assert (outcome.tenant_id, outcome.agent_did, outcome.tool_id) == (
        opened.tenant_id,
        AGENT,
        "core__echo",
    )


async def test_invoke_then_wait_and_events(opened: Opened) -> None:
    handle = await opened.client.invoke(
        "core__long_running",
        {"steps": 2, "step_seconds": 0.5},
        tenant_id=opened.tenant_id,
        agent_did=AGENT,
    )
    assert handle.tenant_id == opened.tenant_id
    events: list[InvocationEvent] = [e async for e in opened.client.events(handle)]
    outcome = await opened.client.wait(handle, timeout=60)
    assert str(outcome.invocation_id) == handle.invocation_id
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result == {"steps_completed": 2, "resumed_from_step": None}
    kinds = [e.kind for e in events]
    assert kinds[0] is EventKind.TOOL_CALL_START
    assert kinds[-1] is EventKind.TOOL_CALL_RESULT
    progress = [e for e in events if e.kind is EventKind.PROGRESS]
    assert progress, kinds  # a step of 0.5 s outlasts the status view's polls
    assert all(e.invocation_id == handle.invocation_id for e in events)
    assert {(e.progress_percent, e.current_phase) for e in progress} <= {
        (50.0, "step 1/2"),
        (100.0, "step 2/2"),
    }


async def test_wait_gives_up_at_its_timeout(opened: Opened) -> None:
    handle = await opened.client.invoke(
        "core__long_running",
        {"steps": 2, "step_seconds": 1.0},
        tenant_id=opened.tenant_id,
        agent_did=AGENT,
    )
    with pytest.raises(TimeoutError):
        await opened.client.wait(handle, timeout=0.2)
    assert (await opened.client.wait(handle, timeout=60)).status is InvocationStatus.SUCCESS


async def test_cancel_stops_a_running_call_and_leaves_a_finished_one(opened: Opened) -> None:
    handle = await opened.client.invoke(
        "core__long_running",
        {"steps": 60, "step_seconds": 0.5},
        tenant_id=opened.tenant_id,
        agent_did=AGENT,
    )
    async for event in opened.client.events(handle):
        if event.kind is EventKind.PROGRESS:
            break  # it runs: a step is done
    cancelled = await opened.client.cancel(handle.invocation_id, reason="enough")
    assert (cancelled.invocation_id, cancelled.cancelled) == (handle.invocation_id, True)
    assert cancelled.message == "cancellation requested"
    outcome = await opened.client.wait(handle, timeout=60)
    assert outcome.status is InvocationStatus.CANCELLED

    again = await opened.client.cancel(handle.invocation_id)
    assert (again.cancelled, again.message) == (
        False,
        "invocation already finished with status cancelled",
    )


async def test_another_tenants_call_is_refused_as_permission_denied(opened: Opened) -> None:
    with pytest.raises(ToolfleetError) as caught:
        await opened.client.invoke("core__echo", tenant_id="t_someone_else", agent_did=AGENT)
    error = caught.value
    code = error.problem_code if isinstance(error, ApiError) else error.code.value
    assert code == "permission_denied"


async def test_status_and_decisions_exist_over_http_and_are_one_typed_error_over_kafka(
    opened: Opened,
) -> None:
    outcome = await opened.client.call(
        "core__echo", {"message": "s"}, tenant_id=opened.tenant_id, agent_did=AGENT, timeout=60
    )
    invocation_id = str(outcome.invocation_id)
    if opened.transport == "kafka":
        for operation in (
            opened.client.status(invocation_id),
            opened.client.approve(invocation_id),
            opened.client.deny(invocation_id),
        ):
            with pytest.raises(NotSupportedByTransport):
                await operation
        return
    view = await opened.client.status(invocation_id)
    assert view is not None
    assert (view.status, view.result) == (outcome.status, outcome.result)
    assert await opened.client.status(str(uuid.uuid4())) is None
    with pytest.raises(ApiError) as caught:  # not pending_approval (nor an approver's token)
        await opened.client.approve(invocation_id)
    assert caught.value.status in (403, 409)
