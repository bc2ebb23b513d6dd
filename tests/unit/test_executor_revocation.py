"""The executor runs nothing for a grant whose capability token was revoked since."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.unit.test_secrets_executor import Cancels, Checkpoints, Emitter
from toolfleet.auth.grants import GrantSigner, GrantVerifier
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.identity import CallRef
from toolfleet.events.models import AgentContext, Effect, InvokeAuthorized
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.executor.service import ExecutorConfig, ExecutorPorts, ExecutorService
from toolfleet.registry.catalog import discover
from toolfleet.storage.revocation import MemoryRevocationList

pytestmark = pytest.mark.unit

KEY = b"k" * 32


class Unreachable(MemoryRevocationList):
    async def is_revoked(self, jti: str) -> bool:
        raise RedisConnectionError("redis is down")


def executor(revocations: MemoryRevocationList) -> tuple[ExecutorService, Emitter]:
    emitter = Emitter()
    svc = ExecutorService(
        ports=ExecutorPorts(
            catalog=discover([]),
            checkpoints=Checkpoints(),
            cancels=Cancels(),
            emitter=emitter,
            grants=GrantVerifier([KEY]),
            revocations=revocations,
        ),
        config=ExecutorConfig(
            worker_id="w",
        ),
    )
    return svc, emitter


def granted(capability_jti: str) -> Envelope:
    data = InvokeAuthorized(
        invocation_id=uuid.uuid4(),
        tool_id="core__echo",
        tool_version="1.0.0",
        requested_version="*",
        agent_context=AgentContext(agent_did="did:agent:a", tenant_id="t1"),
        parameters={"message": "hi"},
        effect=Effect.READ_ONLY,
        timeout_seconds=5,
        requested_at=datetime.now(UTC),
    )
    grant = GrantSigner(KEY).sign(
        call=CallRef(
            invocation_id=str(data.invocation_id),
            tenant_id="t1",
            agent_did="did:agent:a",
            tool_id="core__echo",
            tool_version="1.0.0",
        ),
        parameters=data.parameters,
        capability_jti=capability_jti,
        timeout_s=5,
    )
    return new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data=data.model_copy(update={"grant": grant}),
        tenant_id="t1",
        invocation_id=str(data.invocation_id),
    )


async def test_a_grant_of_a_revoked_token_is_permission_denied_and_runs_nothing() -> None:
    revocations = MemoryRevocationList()
    svc, emitter = executor(revocations)
    [(topic, _)] = await svc.on_authorized(granted("cap-kept"))
    assert topic is TopicName.EXECUTED
    emitter.emitted.clear()

    await revocations.revoke("cap-gone", ttl_s=60)
    [(topic, env)] = await svc.on_authorized(granted("cap-gone"))
    assert topic is TopicName.RESULTS
    assert env.data["status"] == "permission_denied"
    assert env.data["error"]["code"] == "permission_denied"
    assert "revoked" in env.data["error"]["message"]
    assert emitter.emitted == []  # no `invoked`: the tool never started


async def test_an_unreachable_revocation_list_runs_nothing() -> None:
    svc, emitter = executor(Unreachable())
    # Not an outcome either: the consumer retries the event until Redis answers.
    with pytest.raises(RedisConnectionError):
        await svc.on_authorized(granted("cap-1"))
    assert emitter.emitted == []
