"""Document pins survive a crash: the fleet as processes, the reference document server
started by the executor as a stdio MCP server."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.integration.test_documents import reference_command, write_documents
from tests.support.eventually import eventually
from tests.support.fleet import ProcessFleet, process_fleet
from tests.support.pipeline import Fleet, fleet_settings
from toolfleet.client import Progress
from toolfleet.documents.cache import CHANNEL
from toolfleet.events.models import (
    AgentContext,
    DocumentContext,
    InvocationStatus,
    InvokeRequested,
)
from toolfleet.settings import FleetSettings
from toolfleet.storage.redis import connect_redis

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

AGENT = "did:agent:e2e-docs"
V1 = "the handbook, first edition"
V2 = "the handbook, second edition"


@pytest.fixture(scope="module")
def documents_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("e2e-documents") / "documents.json"
    write_documents(path, {"handbook": [V1]})
    return path


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory, documents_file: Path
) -> AsyncIterator[tuple[Fleet, ProcessFleet]]:
    home: Path = tmp_path_factory.mktemp("e2e-docs")
    local = fleet_settings(settings, home, session_timeout_ms=6000)
    async with process_fleet(
        local, home, TOOLFLEET_DOCUMENT_SOURCE=reference_command(documents_file)
    ) as running:
        yield running


def read_request(fleet: Fleet, **params: object) -> InvokeRequested:
    return InvokeRequested(
        invocation_id=uuid.uuid4(),
        tool_id="test__read_document",
        agent_context=AgentContext(agent_did=AGENT, tenant_id="t1"),
        parameters={"document_id": "handbook", **params},
        capability_token=fleet.token("t1", AGENT),
        document_context=DocumentContext.model_validate(
            {"documents": [{"document_id": "handbook"}]}
        ),
    )


async def test_a_long_call_pinned_to_version_1_resumes_after_kill_9_still_on_version_1(
    fleet: tuple[Fleet, ProcessFleet], documents_file: Path
) -> None:
    running, procs = fleet
    handle = await running.client.publish(read_request(running, steps=16, step_seconds=0.25))
    seen: list[Progress] = []
    waiting = asyncio.create_task(running.client.wait(handle, timeout=150, on_progress=seen.append))

    async def some_progress() -> bool:
        return any((p.progress_percent or 0) >= 25 for p in seen)

    await eventually(some_progress, timeout=60)
    # Version 2 arrives mid-call, announced as a writer would: every cache drops version 1.
    write_documents(documents_file, {"handbook": [V1, V2]})
    redis = connect_redis(running.settings.redis_url)
    try:
        await redis.publish(CHANNEL, "handbook")
    finally:
        await redis.aclose()
    procs.kill(procs.procs["executor"][0], signal.SIGKILL)
    procs.start("executor")

    outcome = await waiting
    assert outcome.status is InvocationStatus.SUCCESS, procs.logs()
    assert outcome.result is not None
    assert outcome.result["resumed_from_step"] is not None, "the call did not resume"
    assert outcome.execution_metadata.resumed_from_checkpoint_id is not None
    assert set(outcome.result["versions_seen"]) == {"1"}
    assert outcome.result["content"] == V1
    assert [(a.document_id, a.version, a.access) for a in outcome.documents_accessed] == [
        ("handbook", "1", "read")
    ]

    # Version 2 does exist: a new call reads it.
    fresh = await running.client.wait(
        await running.client.publish(read_request(running)), timeout=60
    )
    assert fresh.result is not None, fresh.error
    assert fresh.result["versions_seen"] == ["2"]
