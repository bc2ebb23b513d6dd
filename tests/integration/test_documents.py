"""Document context through the real fleet, with the reference server as a stdio MCP server.

Policy, executor and validator run in-process on the real broker, Redis and Postgres;
the executor starts ``toolfleet.documents.reference_server`` as its document source.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.documents.cache import CHANNEL
from toolfleet.documents.mcp_source import McpDocumentSource
from toolfleet.documents.source import DocumentQuery
from toolfleet.errors import DocumentNotFound, DocumentSourceUnavailable, ErrorCode
from toolfleet.events.models import (
    AgentContext,
    DocumentContext,
    DocumentRef,
    InvocationStatus,
    InvokeRequested,
    ToolOutcome,
)
from toolfleet.settings import FleetSettings
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration

AGENT = "did:agent:docs"


def write_documents(path: Path, documents: dict[str, list[str]]) -> None:
    path.write_text(
        json.dumps(
            {
                "documents": [
                    {
                        "document_id": doc_id,
                        "title": doc_id.title(),
                        "versions": [
                            {"version": str(i + 1), "content": text} for i, text in enumerate(texts)
                        ],
                    }
                    for doc_id, texts in documents.items()
                ]
            }
        )
    )


def reference_command(path: Path) -> str:
    return shlex.join([sys.executable, "-m", "toolfleet.documents.reference_server", str(path)])


@pytest.fixture(scope="module")
def documents_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("documents") / "documents.json"
    write_documents(
        path,
        {
            "handbook": ["the handbook, first edition"],
            "pricing": ["prices of the first edition"],
            "secret-plan": ["not for this call"],
        },
    )
    return path


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory, documents_file: Path
) -> AsyncIterator[Fleet]:
    home = tmp_path_factory.mktemp("docfleet")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TOOLFLEET_DOCUMENT_SOURCE", reference_command(documents_file))
        async with in_process_fleet(fleet_settings(settings, home)) as running:
            yield running


async def read(
    fleet: Fleet, document_id: str, context: dict[str, Any] | None, **params: Any
) -> ToolOutcome:
    request = InvokeRequested(
        invocation_id=uuid.uuid4(),
        tool_id="test__read_document",
        agent_context=AgentContext(agent_did=AGENT, tenant_id="t1"),
        parameters={"document_id": document_id, **params},
        capability_token=fleet.token("t1", AGENT),
        document_context=None if context is None else DocumentContext.model_validate(context),
    )
    handle = await fleet.client.publish(request)
    return await fleet.client.wait(handle, timeout=60)


async def test_a_tool_reads_a_document_and_the_outcome_lists_it(fleet: Fleet) -> None:
    outcome = await fleet.client.call(
        "test__read_document",
        {"document_id": "handbook"},
        tenant_id="t1",
        agent_did=AGENT,
        capability_token=fleet.token("t1", AGENT),
        document_context=DocumentContext(documents=[DocumentRef(document_id="handbook")]),
        timeout=60,
    )
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.result == {
        "versions_seen": ["1"],
        "content": "the handbook, first edition",
        "resumed_from_step": None,
    }
    assert [a.model_dump() for a in outcome.documents_accessed] == [
        {"document_id": "handbook", "version": "1", "access": "read"}
    ]


async def test_a_request_in_the_specification_shape_is_accepted_not_invalid_event(
    fleet: Fleet,
) -> None:
    context = {"documents": [{"document_id": "pricing", "version": "1"}], "source": "default"}
    outcome = await read(fleet, "pricing", context)
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.documents_accessed[0].version == "1"


async def test_a_document_the_request_does_not_name_is_refused(fleet: Fleet) -> None:
    outcome = await read(fleet, "secret-plan", {"documents": [{"document_id": "handbook"}]})
    assert outcome.status is InvocationStatus.ERROR
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.DOCUMENT_ACCESS_DENIED
    assert "not for this call" not in outcome.model_dump_json()
    assert outcome.documents_accessed == []
    without = await read(fleet, "handbook", None)
    assert without.error is not None
    assert without.error.code is ErrorCode.DOCUMENT_ACCESS_DENIED


async def test_a_missing_document_is_document_not_found(fleet: Fleet) -> None:
    outcome = await read(fleet, "nowhere", {"documents": [{"document_id": "nowhere"}]})
    assert outcome.error is not None
    assert outcome.error.code is ErrorCode.DOCUMENT_NOT_FOUND


async def test_an_update_is_served_once_published_on_document_updates(
    fleet: Fleet, documents_file: Path
) -> None:
    context = {"documents": [{"document_id": "handbook"}]}
    first = await read(fleet, "handbook", context)
    assert first.result is not None
    assert first.result["versions_seen"] == ["1"]
    write_documents(
        documents_file,
        {
            "handbook": ["the handbook, first edition", "the handbook, second edition"],
            "pricing": ["prices of the first edition"],
            "secret-plan": ["not for this call"],
        },
    )
    # Unannounced, the change waits for the cache's TTL (5 minutes): still version 1.
    cached = await read(fleet, "handbook", context)
    assert cached.result is not None
    assert cached.result["versions_seen"] == ["1"]

    redis = connect_redis(fleet.settings.redis_url)
    try:
        assert await redis.publish(CHANNEL, "handbook") >= 1
    finally:
        await redis.aclose()
    fresh = await read(fleet, "handbook", context)
    assert fresh.result is not None
    assert fresh.result["versions_seen"] == ["2"]
    assert fresh.result["content"] == "the handbook, second edition"


async def test_the_mcp_source_speaks_the_four_tools_of_the_document_bridge(
    tmp_path: Path,
) -> None:
    path = tmp_path / "docs.json"
    write_documents(path, {"alpha": ["red green", "red green blue"], "beta": ["green sea"]})
    source = McpDocumentSource(reference_command(path), timeout_s=20)
    stop = asyncio.Event()
    session = asyncio.create_task(source.run(stop))
    try:
        latest = await source.get(DocumentQuery(document_id="alpha"))
        assert (latest.version, latest.content) == ("2", "red green blue")
        first = await source.get(DocumentQuery(document_id="alpha", version="1"))
        assert first.content == "red green"
        meta = await source.metadata("alpha")
        assert (meta.latest_version, meta.versions) == ("2", ["1", "2"])
        assert [h.document_id for h in await source.search("sea", limit=5)] == ["beta"]
        assert [h.document_id for h in await source.overlaps("alpha", limit=5)] == ["beta"]
        with pytest.raises(DocumentNotFound):
            await source.get(DocumentQuery(document_id="gamma"))
    finally:
        stop.set()
        await session


async def test_a_source_that_cannot_start_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    source = McpDocumentSource(f"{sys.executable} -c 'raise SystemExit(3)'", timeout_s=2)
    stop = asyncio.Event()
    session = asyncio.create_task(source.run(stop))
    try:
        with pytest.raises(DocumentSourceUnavailable) as exc:
            await source.get(DocumentQuery(document_id="alpha"))
        assert exc.value.to_error_info().retryable
    finally:
        stop.set()
        await session


def children_running(marker: str) -> list[int]:
    """Pids of this process's children whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == os.getpid() and marker in cmdline:
            found.append(int(entry.name))
    return found


async def test_a_crashed_stdio_source_fails_one_read_retryably_then_is_started_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "crashing.json"
    write_documents(path, {"alpha": ["red"]})
    source = McpDocumentSource(reference_command(path), timeout_s=20)
    stop = asyncio.Event()
    session = asyncio.create_task(source.run(stop))
    try:
        assert (await source.get(DocumentQuery(document_id="alpha"))).version == "1"
        (server,) = children_running(str(path))
        os.kill(server, signal.SIGKILL)
        with pytest.raises(DocumentSourceUnavailable) as exc:
            await source.get(DocumentQuery(document_id="alpha"))
        assert exc.value.to_error_info().retryable
        assert (await source.get(DocumentQuery(document_id="alpha"))).content == "red"
        assert children_running(str(path)) != [server]
    finally:
        stop.set()
        await session
