"""The executor resolves declared credentials per call and never emits one."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.support import sample_tools
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.models import AgentContext, Effect, InvokeAuthorized
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.executor.checkpoints.store import Checkpoint
from toolfleet.executor.service import ExecutorConfig, ExecutorPorts, ExecutorService
from toolfleet.registry.catalog import ToolCatalog
from toolfleet.secrets.env import EnvSecretStore

pytestmark = pytest.mark.unit

VALUE = "tf-unit-9f8e7d6c5b4a"


class Checkpoints:
    def __init__(self) -> None:
        self.saved: list[Checkpoint] = []

    async def save(self, checkpoint: Checkpoint, *, fence: object = None) -> str:
        self.saved.append(checkpoint)
        return checkpoint.checkpoint_type

    async def latest(self, invocation_id: str) -> Checkpoint | None:
        return None


class Cancels:
    async def request(self, invocation_id: str) -> None:
        pass

    async def is_requested(self, invocation_id: str) -> bool:
        return False


class Emitter:
    def __init__(self) -> None:
        self.emitted: list[tuple[TopicName, Envelope]] = []

    async def emit(self, topic: TopicName, envelope: Envelope) -> Awaitable[object]:
        self.emitted.append((topic, envelope))
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def service(environ: dict[str, str]) -> tuple[ExecutorService, Emitter, Checkpoints]:
    emitter, checkpoints = Emitter(), Checkpoints()
    svc = ExecutorService(
        ports=ExecutorPorts(
            catalog=ToolCatalog([sample_tools.secret_user, sample_tools.secret_leaker]),
            checkpoints=checkpoints,
            cancels=Cancels(),
            emitter=emitter,
            secrets=EnvSecretStore(environ),
        ),
        config=ExecutorConfig(
            worker_id="w",
        ),
    )
    return svc, emitter, checkpoints


def authorized(tool_id: str, connection_id: str | None, **params: Any) -> Envelope:
    data = InvokeAuthorized(
        invocation_id=uuid.uuid4(),
        tool_id=tool_id,
        tool_version="1.0.0",
        requested_version="*",
        agent_context=AgentContext(agent_did="did:agent:a", tenant_id="t1"),
        parameters=params,
        connection_id=connection_id,
        effect=Effect.READ_ONLY,
        timeout_seconds=5,
        requested_at=datetime.now(UTC),
    )
    return new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data=data,
        tenant_id="t1",
        invocation_id=str(data.invocation_id),
    )


ENV = {"TOOLFLEET_SECRET__T1__CONN1__API_KEY": VALUE}


async def test_declared_credential_is_resolved_and_used() -> None:
    svc, _, _ = service(ENV)
    [(topic, env)] = await svc.on_authorized(authorized("test__secret_user", "conn1"))
    assert topic is TopicName.EXECUTED
    assert env.data["result"]["length"] == len(VALUE)
    assert VALUE not in env.model_dump_json()


async def test_no_connection_is_permission_denied() -> None:
    svc, emitter, _ = service(ENV)
    [(topic, env)] = await svc.on_authorized(authorized("test__secret_user", None))
    assert topic is TopicName.RESULTS
    assert env.data["status"] == "permission_denied"
    assert "tool needs a connection" in env.data["error"]["message"]
    assert emitter.emitted == []  # it never started


async def test_missing_secret_is_permission_denied_with_a_safe_message() -> None:
    svc, _, _ = service(ENV)
    [(_, env)] = await svc.on_authorized(authorized("test__secret_user", "conn2"))
    assert env.data["error"]["code"] == "permission_denied"
    assert "TOOLFLEET_SECRET" not in env.data["error"]["message"]


async def test_no_store_refuses_tools_that_need_one() -> None:
    svc, _, _ = service(ENV)
    svc = replace(svc, ports=replace(svc.ports, secrets=None))
    [(_, env)] = await svc.on_authorized(authorized("test__secret_user", "conn1"))
    assert env.data["error"]["code"] == "permission_denied"


@pytest.mark.parametrize("how", ["raw", "base64", "error", "checkpoint"])
async def test_leaks_fail_with_redaction_failed_and_are_never_emitted(how: str) -> None:
    svc, emitter, checkpoints = service(ENV)
    outputs = await svc.on_authorized(authorized("test__secret_leaker", "conn1", how=how))
    [(topic, env)] = outputs
    assert topic is TopicName.RESULTS
    assert env.data["error"]["code"] == "redaction_failed"
    assert env.data["result"] is None
    everything = "".join(e.model_dump_json() for _, e in [*outputs, *emitter.emitted])
    assert VALUE not in everything
    assert all(VALUE not in str(c.state) for c in checkpoints.saved)
    assert not checkpoints.saved
