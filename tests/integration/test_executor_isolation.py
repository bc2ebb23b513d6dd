"""The executor running hostile tools in sandboxes: typed outcomes, usage figures, and
an executor that keeps serving, with other calls undisturbed.

The executor's ports are in-memory twins; the sandboxes are real (bubblewrap, seccomp,
rlimits), as are the grant keys binding the token's filesystem permissions.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support import hostile_tools
from toolfleet.audit.records import audit_record
from toolfleet.auth.grants import GrantSigner, GrantVerifier
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.identity import CallKey, CallRef
from toolfleet.events.models import (
    AgentContext,
    CancelRequested,
    Effect,
    InvokeAuthorized,
    ResourceLimits,
)
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.executor.checkpoints.store import MemoryCheckpointStore
from toolfleet.executor.isolated import EgressEvents
from toolfleet.executor.service import ExecutorConfig, ExecutorPorts, ExecutorService
from toolfleet.isolation.egress import EgressProxy
from toolfleet.isolation.runtime import IsolationRuntime, RuntimeConfig
from toolfleet.registry.catalog import ToolCatalog
from toolfleet.storage.cancel_flags import MemoryCancelFlags
from toolfleet.tools.limits import FleetLimits

pytestmark = pytest.mark.integration

TENANT, AGENT = "tenant_iso", "did:agent:iso"
KEY = b"g" * 32


@dataclass
class Emitter:
    emitted: list[tuple[TopicName, Envelope]] = field(default_factory=list)

    async def emit(self, topic: TopicName, envelope: Envelope) -> Awaitable[object]:
        self.emitted.append((topic, envelope))
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


@pytest.fixture(scope="module")
async def service() -> AsyncIterator[ExecutorService]:
    async with IsolationRuntime(config=RuntimeConfig(warm_sandboxes=2)) as runtime:
        yield ExecutorService(
            ports=ExecutorPorts(
                catalog=ToolCatalog(
                    [
                        hostile_tools.echo,
                        hostile_tools.busy_loop,
                        hostile_tools.memory_hog,
                        hostile_tools.segfault,
                        hostile_tools.fork_bomb,
                        hostile_tools.read_file,
                        hostile_tools.steps,
                        hostile_tools.needy,
                    ]
                ),
                checkpoints=MemoryCheckpointStore(),
                cancels=MemoryCancelFlags(),
                emitter=Emitter(),
                grants=GrantVerifier([KEY]),
                isolation=runtime,
            ),
            config=ExecutorConfig(
                worker_id="w-iso",
                cancel_grace_s=2.0,
                isolation_limits=FleetLimits(memory_mb=384, kill_grace_s=0.5),
            ),
        )


def authorized(
    tool_id: str,
    params: dict[str, Any] | None = None,
    *,
    timeout_s: float = 5,
    filesystem: list[str] | None = None,
    network: list[str] | None = None,
    **fields: Any,
) -> Envelope:
    invocation_id = uuid.uuid4()
    grant = GrantSigner(KEY).sign(
        call=CallRef(
            invocation_id=str(invocation_id),
            tenant_id=TENANT,
            agent_did=AGENT,
            tool_id=tool_id,
            tool_version="1.0.0",
        ),
        parameters=params or {},
        capability_jti="jti-1",
        timeout_s=timeout_s,
        filesystem_permissions=filesystem or [],
        network_permissions=network or [],
    )
    data = InvokeAuthorized(
        invocation_id=invocation_id,
        tool_id=tool_id,
        tool_version="1.0.0",
        requested_version="*",
        agent_context=AgentContext(agent_did=AGENT, tenant_id=TENANT),
        parameters=params or {},
        effect=Effect.READ_ONLY,
        timeout_seconds=timeout_s,
        requested_at=datetime.now(UTC),
        grant=grant,
        **fields,
    )
    return new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data=data,
        tenant_id=TENANT,
        invocation_id=str(invocation_id),
    )


async def outcome(service: ExecutorService, event: Envelope) -> tuple[TopicName, dict[str, Any]]:
    [(topic, env)] = await service.on_authorized(event)
    return topic, env.data


def status(data: dict[str, Any]) -> str:
    return "success" if data.get("error") is None else str(data["error"]["code"])


async def test_hostile_tools_end_typed_while_other_calls_go_on(service: ExecutorService) -> None:
    calls = {
        "hostile__busy_loop": ("timeout", {}, 2.0),
        "hostile__memory_hog": ("resource_exhausted", {}, 20.0),
        "hostile__segfault": ("sandbox_failure", {}, 20.0),
        "hostile__echo": ("success", {"text": "undisturbed"}, 20.0),
    }
    results = await asyncio.gather(
        *(
            outcome(service, authorized(tool_id, params, timeout_s=timeout_s))
            for tool_id, (_, params, timeout_s) in calls.items()
        )
    )
    for (tool_id, (expected, _, _)), (topic, data) in zip(calls.items(), results, strict=True):
        assert status(data) == expected, (tool_id, data.get("error"))
        assert topic is (TopicName.EXECUTED if expected == "success" else TopicName.RESULTS)
    busy = results[0][1]["execution_metadata"]
    # It spun until its timeout: plausible CPU, at most two cores' worth of its run.
    assert 100 <= busy["cpu_used_millicore_seconds"] <= 2 * busy["duration_ms"] + 500
    hog = results[1][1]["execution_metadata"]
    assert 100 <= hog["memory_peak_mb"] <= 420  # up to the fleet's 384 MB address space
    echo = results[3][1]
    assert echo["result"] == {"text": "undisturbed"}
    assert echo["execution_metadata"]["cpu_used_millicore_seconds"] > 0
    assert 5 < echo["execution_metadata"]["memory_peak_mb"] < 200
    # The executor still serves.
    _, again = await outcome(service, authorized("hostile__echo", {"text": "again"}))
    assert again["result"] == {"text": "again"}


async def test_a_fork_bomb_stops_at_the_limit(service: ExecutorService) -> None:
    _, data = await outcome(service, authorized("hostile__fork_bomb", timeout_s=10))
    assert status(data) == "success"
    children, refused = data["result"]["text"].split()
    assert int(children) < 64
    assert refused == "BlockingIOError"


async def test_a_tool_asking_more_than_its_agent_has_is_refused(service: ExecutorService) -> None:
    small = ResourceLimits(memory_mb_limit=128)
    _, data = await outcome(service, authorized("hostile__needy", resource_limits=small))
    assert status(data) == "resource_exhausted"
    assert "calling agent's limit is 128" in data["error"]["message"]
    assert data["error"]["retryable"] is False
    enough = ResourceLimits(memory_mb_limit=512)
    _, ran = await outcome(service, authorized("hostile__needy", resource_limits=enough))
    assert status(ran) == "success"


async def test_the_grant_decides_which_files_the_sandbox_sees(
    service: ExecutorService, tmp_path: Path
) -> None:
    tmp_path.chmod(0o755)  # noqa: ASYNC240 (test setup)
    mine = tmp_path / "mine.txt"
    mine.write_text("granted")
    mine.chmod(0o644)
    params = {"path": str(mine)}
    _, without = await outcome(service, authorized("hostile__read_file", params))
    assert status(without) == "tool_execution_error"
    _, granted = await outcome(
        service, authorized("hostile__read_file", params, filesystem=[str(tmp_path)])
    )
    assert granted["result"] == {"text": "granted"}


async def test_checkpoints_and_cancel_cross_into_the_sandbox(service: ExecutorService) -> None:
    event = authorized("hostile__steps", {"steps": 1000, "step_seconds": 0.05}, timeout_s=30)
    running = asyncio.create_task(outcome(service, event))
    invocation_id = str(event.data_as(InvokeAuthorized).invocation_id)
    store = service.ports.checkpoints
    for _ in range(200):
        if await store.latest(CallKey(tenant_id=TENANT, invocation_id=invocation_id)):
            break
        await asyncio.sleep(0.05)
    cancel = new_event(
        event_type=EventType.CANCEL_REQUESTED,
        source=Source.API,
        data=CancelRequested(invocation_id=uuid.UUID(invocation_id), tenant_id=TENANT),
        tenant_id=TENANT,
        invocation_id=invocation_id,
    )
    await service.on_cancel(cancel)
    _, data = await running
    assert status(data) == "cancelled"
    assert data["execution_metadata"]["checkpoints_created"]


async def test_egress_decisions_become_events_audit_can_record(tmp_path: Path) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    emitter = Emitter()
    events = EgressEvents(emitter=emitter)
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with (
        server,
        EgressProxy(audit=events) as proxy,
        IsolationRuntime(config=RuntimeConfig(warm_sandboxes=0), egress=proxy) as runtime,
    ):
        service = ExecutorService(
            ports=ExecutorPorts(
                catalog=ToolCatalog([hostile_tools.connect]),
                checkpoints=MemoryCheckpointStore(),
                cancels=MemoryCancelFlags(),
                emitter=emitter,
                grants=GrantVerifier([KEY]),
                isolation=runtime,
                egress_events=events,
            ),
            config=ExecutorConfig(
                worker_id="w-egress",
            ),
        )
        grant = [f"127.0.0.1:{port}"]
        allowed = authorized(
            "hostile__connect", {"host": "127.0.0.1", "port": port, "use_proxy": True},
            network=grant,
        )  # fmt: skip
        refused = authorized(
            "hostile__connect", {"host": "127.0.0.1", "port": port + 1, "use_proxy": True},
            network=grant,
        )  # fmt: skip
        _, ok = await outcome(service, allowed)
        _, no = await outcome(service, refused)
    assert ok["result"] == {"text": "200 ok"}
    assert no["result"] == {"text": "403 refused"}
    egress = [env for topic, env in emitter.emitted if env.type == EventType.EGRESS]
    assert [(e.data["port"], e.data["decision"], e.data["reason"]) for e in egress] == [
        (port, "allowed", "granted"),
        (port + 1, "refused", "not_granted"),
    ]
    assert egress[0].traceparent == allowed.traceparent  # the call's trace
    assert events.parents == {}  # released with the call
    record = audit_record(egress[1], topic="invoke.events", audit_id="a1", now=datetime.now(UTC))
    assert record.outcome == "failure"
    assert record.error_code == "permission_denied"
    assert record.invocation_id == str(refused.data_as(InvokeAuthorized).invocation_id)
