"""Executor pools in the services, on twins: policy queues a call whose pool has no live
executor; an executor lacking a call's tool hands it to one of its pool that has it (or
parks it); the sweeper ends waiting calls at their deadline, once, and hands parked ones
over."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support import sample_tools
from tests.unit.test_policy_service import ISSUER, TENANT, Fleet, _ask, _manifest, _request
from toolfleet.auth.grants import GrantSigner, GrantVerifier
from toolfleet.errors import ErrorCode, InvalidEvent
from toolfleet.events.envelope import Emitted, Envelope, new_event
from toolfleet.events.identity import CallKey, CallRef
from toolfleet.events.models import (
    AgentContext,
    CancelRequested,
    Effect,
    InvocationStatus,
    InvokeAuthorized,
    ToolOutcome,
)
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.executor.checkpoints.store import MemoryCheckpointStore
from toolfleet.executor.leasing.guard import LeaseGuard
from toolfleet.executor.leasing.leases import MemoryLeases
from toolfleet.executor.pools import (
    PoolRouter,
    QueueSweeper,
    choose_target,
    deadline_outcome,
)
from toolfleet.executor.service import ExecutorConfig, ExecutorPorts, ExecutorService
from toolfleet.policy.pools import PoolLiveness
from toolfleet.registry.catalog import ToolCatalog
from toolfleet.storage.cancel_flags import MemoryCancelFlags
from toolfleet.storage.pools import (
    ExecutorPresence,
    MemoryPoolPresence,
    MemoryQueuedCalls,
    QueuedCall,
    queued_call,
)

pytestmark = pytest.mark.unit

AGENT = "did:agent:a"
GRANT_KEY = b"g" * 32
T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _topic(pool: str) -> str:
    return f"tf.invoke.authorized.{pool}"


@dataclass
class Sent:
    """A :class:`~toolfleet.executor.pools.PartitionSender` that keeps what it sent."""

    sent: list[tuple[str, int, Envelope]] = field(default_factory=list)

    async def send(self, topic: str, partition: int, envelope: Envelope) -> None:
        self.sent.append((topic, partition, envelope))


@dataclass
class Emitter:
    emitted: list[tuple[TopicName, Envelope]] = field(default_factory=list)

    async def emit(self, topic: TopicName, envelope: Envelope) -> Awaitable[object]:
        self.emitted.append((topic, envelope))
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def _authorized(
    tool_id: str, *, timeout_s: float = 5, at: datetime = T0, signed_at: datetime | None = None
) -> Envelope:
    data = InvokeAuthorized(
        invocation_id=uuid.uuid4(),
        tool_id=tool_id,
        tool_version="1.0.0",
        requested_version="*",
        agent_context=AgentContext(agent_did=AGENT, tenant_id=TENANT),
        parameters={"key": uuid.uuid4().hex},
        effect=Effect.READ_ONLY,
        timeout_seconds=timeout_s,
        requested_at=at,
        pool="gpu",
    )
    payload = data.model_dump(mode="json")
    signer = GrantSigner(GRANT_KEY, clock=lambda: (signed_at or datetime.now(UTC)).timestamp())
    payload["grant"] = signer.sign(
        call=CallRef.of(data),
        parameters=data.parameters,
        capability_jti="j",
        timeout_s=timeout_s,
        pool=data.pool,
    )
    event = new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data=payload,
        tenant_id=TENANT,
        invocation_id=str(data.invocation_id),
    )
    return event.model_copy(update={"time": at})


def _executor(name: str, *, pools: tuple[str, ...], tools: tuple[str, ...], parts: Any) -> Any:
    return ExecutorPresence(worker_id=name, pools=pools, tools=tools, partitions=parts)


# --- choosing where a call goes ---------------------------------------------------------------


def test_a_call_goes_to_an_executor_of_its_pool_with_its_tool_and_partitions() -> None:
    executors = [
        _executor("lacks", pools=("gpu",), tools=(), parts={"gpu": (0, 1)}),
        _executor("other-pool", pools=("cpu",), tools=("acme__x@1.0.0",), parts={"cpu": (0,)}),
        _executor("no-parts", pools=("gpu",), tools=("acme__x@1.0.0",), parts={"gpu": ()}),
        _executor("has", pools=("gpu",), tools=("acme__x@1.0.0",), parts={"gpu": (2, 3)}),
    ]
    picks = {
        choose_target(
            executors, pool="gpu", tool_id="acme__x", tool_version="1.0.0", invocation_id=str(i)
        )
        for i in range(40)
    }
    assert {p.worker_id for p in picks if p} == {"has"}
    assert {p.partition for p in picks if p} == {2, 3}
    assert None not in picks
    again = choose_target(
        executors, pool="gpu", tool_id="acme__x", tool_version="1.0.0", invocation_id="7"
    )
    assert again == choose_target(
        executors[::-1], pool="gpu", tool_id="acme__x", tool_version="1.0.0", invocation_id="7"
    )
    none = choose_target(
        executors,
        pool="gpu",
        tool_id="acme__x",
        tool_version="1.0.0",
        invocation_id="7",
        exclude="has",
    )
    assert none is None


# --- the executor: a tool it lacks -------------------------------------------------------------


@dataclass
class Rig:
    service: ExecutorService
    presence: MemoryPoolPresence
    queued: MemoryQueuedCalls
    sender: Sent
    leases: MemoryLeases


def rig() -> Rig:
    presence, queued, sender = MemoryPoolPresence(), MemoryQueuedCalls(), Sent()
    leases = MemoryLeases(ttl_s=30)
    service = ExecutorService(
        ports=ExecutorPorts(
            catalog=ToolCatalog([sample_tools.cached]),
            checkpoints=MemoryCheckpointStore(),
            cancels=MemoryCancelFlags(),
            emitter=Emitter(),
            grants=GrantVerifier([GRANT_KEY]),
            lease_guard=LeaseGuard(leases=leases, worker_id="here"),
            pool_router=PoolRouter(
                worker_id="here", presence=presence, queued=queued, sender=sender, topic_of=_topic
            ),
        ),
        config=ExecutorConfig(
            worker_id="here",
        ),
    )
    return Rig(service, presence, queued, sender, leases)


async def test_a_call_whose_tool_this_executor_lacks_goes_to_one_that_has_it() -> None:
    parts = rig()
    await parts.presence.announce(
        _executor("there", pools=("gpu",), tools=("acme__render@1.0.0",), parts={"gpu": (3,)})
    )
    event = _authorized("acme__render")
    assert await parts.service.on_authorized(event, pool="gpu") == []
    [(topic, partition, handed)] = parts.sender.sent
    assert (topic, partition) == (_topic("gpu"), 3)
    assert handed.id != event.id  # the pool's group consumed the first one
    assert handed.source == Source.EXECUTOR
    assert handed.data == event.data  # policy's grant, unchanged
    assert (handed.time, handed.traceparent, handed.tenantid) == (
        event.time,
        event.traceparent,
        event.tenantid,
    )
    assert parts.queued.calls == {}
    assert parts.leases.epochs == {}  # nothing was taken: the other executor runs it


async def test_a_call_no_live_executor_of_its_pool_can_run_is_parked_and_queued() -> None:
    parts = rig()
    await parts.presence.announce(  # of the pool, but without the tool
        _executor("there", pools=("gpu",), tools=(), parts={"gpu": (3,)})
    )
    event = _authorized("acme__render", timeout_s=5)
    [(topic, notice)] = await parts.service.on_authorized(event, pool="gpu")
    assert (topic, notice.type) == (TopicName.EVENTS, EventType.INVOKE_QUEUED)
    assert notice.data["reason"] == "tool_not_loaded"
    assert notice.data["worker_id"] == "here"
    assert notice.data["pool"] == "gpu"
    [parked] = await parts.queued.parked(limit=10)
    assert parked.event == event
    assert parked.deadline == T0 + timedelta(seconds=5)
    assert parts.sender.sent == []


async def test_a_tool_nobody_has_outside_a_pool_is_still_tool_not_found() -> None:
    parts = rig()
    [(topic, outcome)] = await parts.service.on_authorized(_authorized("acme__render"))
    assert topic is TopicName.RESULTS
    assert outcome.data["error"]["code"] == ErrorCode.TOOL_NOT_FOUND


async def test_a_forged_call_on_a_pool_topic_is_refused_before_anything_else() -> None:
    parts = rig()
    await parts.presence.announce(
        _executor("there", pools=("gpu",), tools=("acme__render@1.0.0",), parts={"gpu": (3,)})
    )
    event = _authorized("acme__render")
    forged = event.model_copy(update={"data": {**event.data, "grant": None}})
    [(topic, outcome)] = await parts.service.on_authorized(forged, pool="gpu")
    assert topic is TopicName.RESULTS
    assert outcome.data["error"]["code"] == ErrorCode.PERMISSION_DENIED
    tampered = event.model_copy(update={"data": {**event.data, "parameters": {"key": "other"}}})
    [(_, refused)] = await parts.service.on_authorized(tampered, pool="gpu")
    assert refused.data["error"]["code"] == ErrorCode.PERMISSION_DENIED
    assert parts.sender.sent == []  # never handed to anyone
    assert parts.queued.calls == {}


async def test_a_signed_call_cannot_be_moved_to_another_pool() -> None:
    """A producer with topic access copies a granted call onto another pool's topic: as
    it is, it is dead-lettered there (it is not that pool's call, and its real delivery
    runs in its own pool); with its ``pool`` rewritten to match, the grant refuses it."""
    parts = rig()
    await parts.presence.announce(
        _executor("there", pools=("gpu", "cpu"), tools=("acme__render@1.0.0",), parts={})
    )
    event = _authorized("acme__render")
    with pytest.raises(InvalidEvent, match="pool 'gpu' on pool 'cpu'"):
        await parts.service.on_authorized(event, pool="cpu")
    moved = event.model_copy(update={"data": {**event.data, "pool": "cpu"}})
    [(topic, refused)] = await parts.service.on_authorized(moved, pool="cpu")
    assert topic is TopicName.RESULTS
    assert refused.data["error"]["code"] == ErrorCode.PERMISSION_DENIED
    assert "another pool" in refused.data["error"]["message"]
    assert parts.sender.sent == []
    assert parts.queued.calls == {}


async def test_a_call_that_ended_keeps_its_one_outcome_when_its_grant_has_expired() -> None:
    parts = rig()
    # Authorized long ago: the deadline passed, the sweeper ended it, the grant expired.
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    event = _authorized("acme__render", at=long_ago, signed_at=long_ago)
    call = event.data_as(InvokeAuthorized)
    queued = queued_call(event, call, pool="gpu", reason="no_live_executor")
    swept: list[Emitted] = []
    sweeper = _sweeper(parts, swept)
    await parts.queued.add(queued)
    await sweeper.sweep()
    [(_, ended)] = swept
    again = await parts.service.on_authorized(event, pool="gpu")
    assert [(t, e.id) for t, e in again] == [(TopicName.RESULTS, ended.id)]
    # A call of the same age that nobody ended is refused as any expired grant is.
    stale = _authorized("acme__render", at=long_ago, signed_at=long_ago)
    [(_, refused)] = await parts.service.on_authorized(stale, pool="gpu")
    assert refused.data["error"]["code"] == ErrorCode.PERMISSION_DENIED
    assert "expired" in refused.data["error"]["message"]


# --- the sweeper ----------------------------------------------------------------------------


def _sweeper(parts: Rig, published: list[Emitted], *, now: datetime | None = None) -> QueueSweeper:
    async def publish(emitted: list[Emitted]) -> None:
        published.extend(emitted)

    return QueueSweeper(
        worker_id="sweeper",
        queued=parts.queued,
        leases=parts.leases,
        presence=parts.presence,
        sender=parts.sender,
        topic_of=_topic,
        publish=publish,
        clock=(lambda: now) if now is not None else (lambda: datetime.now(UTC)),
    )


def _waiting(timeout_s: float = 5) -> QueuedCall:
    event = _authorized("acme__render", timeout_s=timeout_s)
    return queued_call(
        event, event.data_as(InvokeAuthorized), pool="gpu", reason="no_live_executor"
    )


async def test_a_waiting_call_ends_timeout_at_its_deadline_once() -> None:
    parts, published = rig(), list[Emitted]()
    queued = _waiting(timeout_s=5)
    await parts.queued.add(queued)
    await _sweeper(parts, published, now=T0 + timedelta(seconds=4)).sweep()
    assert published == []
    deadline = _sweeper(parts, published, now=T0 + timedelta(seconds=5))
    await deadline.sweep()
    [(topic, ended)] = published
    assert (topic, ended.type) == (TopicName.RESULTS, EventType.TIMEOUT)
    outcome = ended.data_as(ToolOutcome)
    assert outcome.status is InvocationStatus.TIMEOUT
    assert outcome.error is not None
    assert outcome.error.details == {"pool": "gpu"}
    assert outcome.execution_metadata.attempts == 0
    assert ended.id == deadline_outcome(queued, cancelled=False).id
    assert parts.queued.calls == {}
    await deadline.sweep()
    assert len(published) == 1
    # An executor that reads the call later replays that outcome, runs or parks nothing.
    replay = await parts.service.on_authorized(queued.event, pool="gpu")
    assert [(t, e.id) for t, e in replay] == [(TopicName.RESULTS, ended.id)]


async def test_a_call_running_or_ended_at_its_deadline_keeps_its_own_outcome() -> None:
    parts, published = rig(), list[Emitted]()
    running, ended = _waiting(), _waiting()
    for queued in (running, ended):
        await parts.queued.add(queued)
    await parts.leases.acquire(running.call, "executor-a")  # runs now, under its own timeout
    taken = await parts.leases.acquire(ended.call, "executor-b")
    assert not isinstance(taken, type(None))
    await parts.leases.finish(taken.fence, [])  # type: ignore[union-attr]
    await _sweeper(parts, published, now=T0 + timedelta(minutes=1)).sweep()
    assert published == []
    assert parts.queued.calls == {}


async def test_a_sweep_that_died_after_claiming_the_outcome_publishes_it_again() -> None:
    parts, published = rig(), list[Emitted]()
    queued = _waiting()
    await parts.queued.add(queued)

    async def down(emitted: list[Emitted]) -> None:
        raise ConnectionError("the broker went away")

    dying = _sweeper(parts, [], now=T0 + timedelta(seconds=5))
    dying.publish = down
    with pytest.raises(ConnectionError):
        await dying.sweep()
    assert parts.queued.calls  # not dropped: claimed for a while, then handed out again
    await _sweeper(parts, published, now=T0 + timedelta(minutes=5)).sweep()
    [(_, ended)] = published
    assert ended.id == deadline_outcome(queued, cancelled=False).id
    assert parts.queued.calls == {}


async def test_a_parked_call_goes_to_the_first_executor_of_its_pool_with_its_tool() -> None:
    parts, published = rig(), list[Emitted]()
    event = _authorized("acme__render", timeout_s=60)
    await parts.queued.add(
        queued_call(
            event,
            event.data_as(InvokeAuthorized),
            pool="gpu",
            reason="tool_not_loaded",
            parked_by="here",
        )
    )
    sweeper = _sweeper(parts, published, now=T0 + timedelta(seconds=1))
    await sweeper.sweep()
    assert parts.sender.sent == []
    await parts.presence.announce(
        _executor("new", pools=("gpu",), tools=("acme__render@1.0.0",), parts={"gpu": (1,)})
    )
    await sweeper.sweep()
    [(topic, partition, handed)] = parts.sender.sent
    assert (topic, partition, handed.data) == (_topic("gpu"), 1, event.data)
    assert await parts.queued.parked(limit=10) == []
    await sweeper.sweep()
    assert len(parts.sender.sent) == 1  # handed over once; that executor has it now
    assert parts.queued.calls == {}
    assert published == []


async def test_past_its_deadline_a_call_goes_to_an_executor_of_its_pool_if_there_is_one() -> None:
    parts, published = rig(), list[Emitted]()
    waiting, parked = _waiting(timeout_s=5), _waiting(timeout_s=5)
    await parts.queued.add(waiting)
    await parts.queued.add(parked.model_copy(update={"parked": True, "parked_by": "here"}))
    await parts.presence.announce(
        _executor("back", pools=("gpu",), tools=("acme__render@1.0.0",), parts={"gpu": (0,)})
    )
    await _sweeper(parts, published, now=T0 + timedelta(minutes=1)).sweep()
    # Its executor (restarted, say) reads the waiting one from the topic; the parked
    # one is handed to it: neither is timed out.
    assert published == []
    assert [e.data["invocation_id"] for _, _, e in parts.sender.sent] == [parked.invocation_id]
    assert parts.queued.calls == {}


async def test_a_sweeper_counts_its_own_pools_as_served_before_it_announced_them() -> None:
    parts, published = rig(), list[Emitted]()
    await parts.queued.add(_waiting(timeout_s=5))
    sweeper = _sweeper(parts, published, now=T0 + timedelta(minutes=1))
    sweeper.pools = frozenset({"gpu"})
    await sweeper.sweep()
    assert published == []
    assert parts.queued.calls == {}


# --- policy ---------------------------------------------------------------------------------


async def _policy(*executors: ExecutorPresence) -> tuple[Fleet, MemoryQueuedCalls]:
    presence = MemoryPoolPresence()
    for executor in executors:
        await presence.announce(executor)
    liveness = PoolLiveness(presence)
    await liveness.refresh()
    gpu = _manifest("acme__render", Effect.READ_ONLY).model_copy(update={"pool": "gpu"})
    fleet = Fleet(manifests=[gpu])
    fleet.service.pools = liveness
    fleet.service.queued = queued = MemoryQueuedCalls()
    return fleet, queued


async def test_policy_queues_a_call_whose_pool_has_no_live_executor() -> None:
    fleet, queued = await _policy(_executor("cpu", pools=("default",), tools=(), parts={}))
    request = _request("acme__render", token=ISSUER.issue(tenant_id=TENANT, agent_did=AGENT))
    [(topic, authorized), (events, notice)] = await _ask(fleet, request)
    assert topic is TopicName.AUTHORIZED
    assert authorized.data["pool"] == "gpu"  # the manifest's, for the handler's topic
    assert (events, notice.type) == (TopicName.EVENTS, EventType.INVOKE_QUEUED)
    assert (notice.data["pool"], notice.data["reason"]) == ("gpu", "no_live_executor")
    [waiting] = queued.calls.values()
    assert waiting.event == authorized
    assert waiting.deadline == authorized.time + timedelta(seconds=10)  # type: ignore[operator]


async def test_policy_only_authorizes_a_call_whose_pool_has_an_executor() -> None:
    fleet, queued = await _policy(_executor("g", pools=("gpu",), tools=(), parts={}))
    request = _request("acme__render", token=ISSUER.issue(tenant_id=TENANT, agent_did=AGENT))
    [(topic, authorized)] = await _ask(fleet, request)
    assert (topic, authorized.data["pool"]) == (TopicName.AUTHORIZED, "gpu")
    assert queued.calls == {}


async def test_policy_does_not_guess_while_it_cannot_see_the_executors() -> None:
    liveness = PoolLiveness(MemoryPoolPresence())
    assert liveness.is_served("gpu")  # never read yet
    await liveness.refresh()
    assert not liveness.is_served("gpu")


def test_call_keys_of_queued_calls_are_the_call() -> None:
    queued = _waiting()
    assert queued.call == CallKey(tenant_id=TENANT, invocation_id=queued.invocation_id)


async def test_a_queued_call_cancelled_meanwhile_ends_cancelled_at_the_next_sweep() -> None:
    parts, published = rig(), list[Emitted]()
    queued = _waiting(timeout_s=3600)
    await parts.queued.add(queued)
    cancel = new_event(
        event_type=EventType.CANCEL_REQUESTED,
        source=Source.API,
        data=CancelRequested(invocation_id=uuid.UUID(queued.invocation_id), tenant_id=TENANT),
        tenant_id=TENANT,
        invocation_id=queued.invocation_id,
    )
    await parts.service.on_cancel(cancel)
    sweeper = _sweeper(parts, published, now=T0 + timedelta(seconds=1))
    sweeper.cancels = parts.service.ports.cancels
    await sweeper.sweep()
    [(topic, ended)] = published
    assert (topic, ended.type) == (TopicName.RESULTS, EventType.CANCELLED)
    assert ended.data_as(ToolOutcome).status is InvocationStatus.CANCELLED
    assert parts.queued.calls == {}
