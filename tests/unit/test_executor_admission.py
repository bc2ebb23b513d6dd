"""The executor's admission gates and its run's cleanup, on in-memory twins of every port.

Time is a manual clock wherever it is the subject (circuits, cache TTLs): nothing here
waits for real seconds to pass.
"""

from __future__ import annotations

import asyncio
import gc
import json
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.support import sample_tools
from toolfleet.auth.grants import GrantVerifier
from toolfleet.errors import PermissionDenied
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.identity import CallKey
from toolfleet.events.models import (
    AgentContext,
    CheckpointConfig,
    Effect,
    InvokeAuthorized,
    ToolInvoked,
)
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.executor import admission
from toolfleet.executor.cache import MemoryResultCache
from toolfleet.executor.checkpoints.store import Checkpoint, MemoryCheckpointStore
from toolfleet.executor.circuits.breaker import CircuitBreaker, CircuitState, CircuitStatus
from toolfleet.executor.circuits.store import MemoryCircuitStore
from toolfleet.executor.concurrency import MemoryAgentSlots, agent_key
from toolfleet.executor.leasing.guard import LeaseGuard
from toolfleet.executor.leasing.leases import MemoryLeases
from toolfleet.executor.service import ExecutorConfig, ExecutorPorts, ExecutorService
from toolfleet.registry.catalog import ToolCatalog
from toolfleet.secrets.capability import CredentialCapability
from toolfleet.secrets.env import EnvSecretStore
from toolfleet.storage.cancel_flags import MemoryCancelFlags

pytestmark = pytest.mark.unit

TENANT, AGENT = "t1", "did:agent:a"
SECRET = "tf-admission-5e4d3c2b1a"
ENV = {"TOOLFLEET_SECRET__T1__CONN1__API_KEY": SECRET}


class ManualClock:
    """Seconds that pass only when a test says so."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class EmitterDown(Exception):
    pass


@dataclass
class Emitter:
    emitted: list[tuple[TopicName, Envelope]] = field(default_factory=list)
    fail_on: EventType | None = None

    async def emit(self, topic: TopicName, envelope: Envelope) -> Awaitable[object]:
        if envelope.type == self.fail_on:
            raise EmitterDown("the producer is gone")
        self.emitted.append((topic, envelope))
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def of_type(self, event_type: EventType) -> list[Envelope]:
        return [env for _, env in self.emitted if env.type == event_type]


@dataclass
class Rig:
    service: ExecutorService
    emitter: Emitter
    cancels: MemoryCancelFlags
    slots: MemoryAgentSlots
    cache: MemoryResultCache
    checkpoints: MemoryCheckpointStore
    circuits: MemoryCircuitStore
    clock: ManualClock


def rig(clock: ManualClock | None = None, **overrides: Any) -> Rig:
    clock = clock or ManualClock()
    parts = Rig(
        service=None,  # type: ignore[arg-type]  # built below, over the twins
        emitter=Emitter(),
        cancels=MemoryCancelFlags(),
        slots=MemoryAgentSlots(clock=clock),
        cache=MemoryResultCache(clock=clock),
        checkpoints=MemoryCheckpointStore(),
        circuits=MemoryCircuitStore(),
        clock=clock,
    )
    parts.service = ExecutorService(
        ports=ExecutorPorts(
            catalog=ToolCatalog(
                [
                    sample_tools.cached,
                    sample_tools.breaker,
                    sample_tools.windowed,
                    sample_tools.secret_user,
                ]
            ),
            checkpoints=parts.checkpoints,
            cancels=parts.cancels,
            emitter=parts.emitter,
            secrets=EnvSecretStore(ENV),
            slots=parts.slots,
            breaker=CircuitBreaker(store=parts.circuits, clock=clock),
            cache=parts.cache,
            **overrides,
        ),
        config=ExecutorConfig(
            worker_id="w",
        ),
    )
    return parts


def authorized(
    tool_id: str,
    params: dict[str, Any] | None = None,
    *,
    invocation_id: uuid.UUID | None = None,
    **fields: Any,
) -> Envelope:
    data = InvokeAuthorized(
        invocation_id=invocation_id or uuid.uuid4(),
        tool_id=tool_id,
        tool_version="1.0.0",
        requested_version="*",
        agent_context=AgentContext(agent_did=AGENT, tenant_id=TENANT),
        parameters=params or {},
        effect=Effect.READ_ONLY,
        timeout_seconds=5,
        requested_at=datetime.now(UTC),
        **fields,
    )
    return new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data=data,
        tenant_id=TENANT,
        invocation_id=str(data.invocation_id),
    )


def call_of(event: Envelope) -> CallKey:
    """The call an authorized event names: its tenant and its invocation id."""
    return CallKey(tenant_id=TENANT, invocation_id=str(event.data["invocation_id"]))


async def outcome(parts: Rig, event: Envelope) -> tuple[TopicName, dict[str, Any]]:
    [(topic, env)] = await parts.service.on_authorized(event)
    return topic, env.data


def status_of(data: dict[str, Any]) -> str:
    error = data.get("error")
    return "success" if error is None else str(error["code"])


def circuit_state(parts: Rig, name: str) -> CircuitState:
    return CircuitState.from_json(parts.circuits.states.get(name, ""))


# -- grant ------------------------------------------------------------------------


async def test_a_call_without_policys_grant_runs_nothing() -> None:
    parts = rig(grants=GrantVerifier([b"k" * 32]))
    key = uuid.uuid4().hex
    topic, data = await outcome(parts, authorized("test__cached", {"key": key}))
    assert topic is TopicName.RESULTS
    assert status_of(data) == "permission_denied"
    assert sample_tools.RUNS[f"cached:{key}"] == 0
    assert parts.emitter.emitted == []


# -- cancel, tool -----------------------------------------------------------------


async def test_a_raised_cancel_flag_refuses_the_call_before_it_runs() -> None:
    parts = rig()
    key = uuid.uuid4().hex
    event = authorized("test__cached", {"key": key})
    await parts.cancels.request(call_of(event))
    topic, data = await outcome(parts, event)
    assert topic is TopicName.RESULTS
    assert status_of(data) == "cancelled"
    assert data["error"]["message"] == "cancelled before it ran"
    assert sample_tools.RUNS[f"cached:{key}"] == 0
    assert parts.emitter.of_type(EventType.INVOKED) == []


async def test_a_tool_this_executor_lacks_is_tool_not_found() -> None:
    parts = rig()
    topic, data = await outcome(parts, authorized("test__nowhere"))
    assert topic is TopicName.RESULTS
    assert status_of(data) == "tool_not_found"


# -- cache ------------------------------------------------------------------------


async def test_a_cached_result_answers_the_same_call_without_running_it() -> None:
    parts = rig()
    key = uuid.uuid4().hex
    topic, first = await outcome(parts, authorized("test__cached", {"key": key}))
    assert topic is TopicName.EXECUTED
    assert first["execution_metadata"]["cached"] is False
    topic, second = await outcome(parts, authorized("test__cached", {"key": key}))
    assert topic is TopicName.EXECUTED
    assert second["execution_metadata"]["cached"] is True
    assert second["execution_metadata"]["attempts"] == 0
    assert second["result"] == first["result"] == {"value": 1}
    assert sample_tools.RUNS[f"cached:{key}"] == 1
    assert len(parts.emitter.of_type(EventType.INVOKED)) == 1  # the hit never started


async def test_a_cache_entry_expires_after_its_ttl_on_the_clock() -> None:
    parts = rig()
    key = uuid.uuid4().hex
    await outcome(parts, authorized("test__cached", {"key": key}))
    parts.clock.advance(60.5)  # test__cached keeps results 60 s
    _, again = await outcome(parts, authorized("test__cached", {"key": key}))
    assert again["execution_metadata"]["cached"] is False
    assert again["result"] == {"value": 2}


# -- circuit ----------------------------------------------------------------------


async def test_an_open_circuit_fails_fast_until_open_s_passes_then_trials_close_it() -> None:
    parts = rig()
    # window 4, minimum 3 calls, 50 % failures: three failures open it.
    for _ in range(3):
        _, failed = await outcome(parts, authorized("test__breaker", {"fail": True}))
        assert status_of(failed) == "external_api_error"
    assert circuit_state(parts, "test.breaker").status is CircuitStatus.OPEN

    parts.clock.advance(1.5)
    topic, refused = await outcome(parts, authorized("test__breaker", {"fail": False}))
    assert topic is TopicName.RESULTS
    assert status_of(refused) == "circuit_breaker_open"
    assert refused["error"]["retryable"] is True
    assert refused["error"]["retry_after_s"] == pytest.approx(0.5)
    assert refused["execution_metadata"]["attempts"] == 0

    parts.clock.advance(0.5)  # open_s (2 s) has passed: two half-open trials close it
    _, trial = await outcome(parts, authorized("test__breaker", {"fail": False}))
    assert status_of(trial) == "success"
    assert circuit_state(parts, "test.breaker").status is CircuitStatus.HALF_OPEN
    _, trial = await outcome(parts, authorized("test__breaker", {"fail": False}))
    assert status_of(trial) == "success"
    assert circuit_state(parts, "test.breaker").status is CircuitStatus.CLOSED

    opened = parts.emitter.of_type(EventType.CIRCUIT_OPENED)
    closed = parts.emitter.of_type(EventType.CIRCUIT_CLOSED)
    assert [e.data["retry_after_s"] for e in opened] == [2.0]
    assert len(closed) == 1
    states = [json.loads(p)["state"] for p in parts.circuits.published]
    assert states == ["open", "half_open", "closed"]


async def test_a_time_window_forgets_old_failures_and_canaries_close_it() -> None:
    parts = rig()
    # window 3 s, minimum 2 calls, 50 % failures: a failure older than the window does
    # not count, so two failures 3.2 s apart leave it closed.
    await outcome(parts, authorized("test__windowed", {"fail": True}))
    parts.clock.advance(3.2)
    await outcome(parts, authorized("test__windowed", {"fail": True}))
    stored = circuit_state(parts, "test.windowed")
    assert stored.status is CircuitStatus.CLOSED
    assert (len(stored.window), len(stored.times)) == (1, 1)

    _, failed = await outcome(parts, authorized("test__windowed", {"fail": True}))
    assert status_of(failed) == "external_api_error"
    assert circuit_state(parts, "test.windowed").status is CircuitStatus.OPEN
    _, refused = await outcome(parts, authorized("test__windowed", {"fail": False}))
    assert status_of(refused) == "circuit_breaker_open"

    parts.clock.advance(3.1)  # after open_s, two canaries in a row (one at a time)
    _, first = await outcome(parts, authorized("test__windowed", {"fail": False}))
    assert status_of(first) == "success"
    half = circuit_state(parts, "test.windowed")
    assert half.status is CircuitStatus.HALF_OPEN
    assert (half.trials_started, half.trials_succeeded) == (1, 1)
    _, second = await outcome(parts, authorized("test__windowed", {"fail": False}))
    assert status_of(second) == "success"
    assert circuit_state(parts, "test.windowed").status is CircuitStatus.CLOSED


# -- credentials ------------------------------------------------------------------


@pytest.fixture
def capabilities(monkeypatch: pytest.MonkeyPatch) -> list[CredentialCapability]:
    """Every capability the credentials gate resolves, kept to check it was revoked."""
    resolved: list[CredentialCapability] = []
    resolve = admission.resolve_credentials

    async def keep(*args: Any, **kwargs: Any) -> CredentialCapability:
        capability = await resolve(*args, **kwargs)
        resolved.append(capability)
        return capability

    monkeypatch.setattr(admission, "resolve_credentials", keep)
    return resolved


async def test_credentials_are_revoked_when_the_call_returns(
    capabilities: list[CredentialCapability],
) -> None:
    parts = rig()
    topic, data = await outcome(parts, authorized("test__secret_user", connection_id="conn1"))
    assert topic is TopicName.EXECUTED
    assert data["result"]["length"] == len(SECRET)
    [capability] = capabilities
    with pytest.raises(PermissionDenied):
        capability.get("api_key")


async def test_a_tool_that_needs_credentials_and_has_no_connection_never_starts() -> None:
    parts = rig()
    topic, data = await outcome(parts, authorized("test__secret_user"))
    assert topic is TopicName.RESULTS
    assert status_of(data) == "permission_denied"
    assert parts.emitter.emitted == []


# -- slot -------------------------------------------------------------------------


async def fill_slots(parts: Rig, limit: int) -> str:
    key = agent_key(TENANT, AGENT)
    for n in range(limit):
        assert await parts.slots.try_acquire(key, f"other-{n}", limit, lease_s=60)
    return key


async def test_the_agents_slot_is_released_when_the_call_ends() -> None:
    parts = rig()
    key = agent_key(TENANT, AGENT)
    _, data = await outcome(parts, authorized("test__cached", {"key": uuid.uuid4().hex}))
    assert status_of(data) == "success"
    assert parts.slots.held[key] == {}


async def test_a_cancel_ends_the_wait_for_a_slot() -> None:
    parts = rig()
    key = await fill_slots(parts, 2)
    event = authorized("test__cached", {"key": uuid.uuid4().hex}, max_concurrent_per_agent=2)
    waiting = asyncio.create_task(parts.service.on_authorized(event))
    await asyncio.sleep(0)  # it waits: the agent's two slots are taken
    assert not waiting.done()
    await parts.cancels.request(call_of(event))
    [(topic, env)] = await asyncio.wait_for(waiting, timeout=10)
    assert topic is TopicName.RESULTS
    assert status_of(env.data) == "cancelled"
    assert set(parts.slots.held[key]) == {"other-0", "other-1"}


async def test_a_call_waiting_for_a_slot_at_shutdown_is_handed_over_unstarted() -> None:
    parts = rig()
    await fill_slots(parts, 1)
    event = authorized("test__cached", {"key": uuid.uuid4().hex}, max_concurrent_per_agent=1)
    waiting = asyncio.create_task(parts.service.on_authorized(event))
    await asyncio.sleep(0)
    parts.service.suspend()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, timeout=10)
    assert parts.emitter.emitted == []


# -- resume -----------------------------------------------------------------------


def checkpoint(invocation_id: str, *, tenant_id: str = TENANT) -> Checkpoint:
    return Checkpoint(
        checkpoint_id=uuid.uuid4().hex,
        invocation_id=invocation_id,
        tenant_id=tenant_id,
        checkpoint_type="macro",
        state={"step": 3},
        progress_percent=30,
        current_phase="copying",
        timestamp=datetime.now(UTC),
    )


async def test_a_run_starts_from_its_latest_checkpoint() -> None:
    parts = rig()
    inv = uuid.uuid4()
    saved = checkpoint(str(inv))
    await parts.checkpoints.save(saved)
    _, data = await outcome(
        parts, authorized("test__cached", {"key": uuid.uuid4().hex}, invocation_id=inv)
    )
    assert data["execution_metadata"]["resumed_from_checkpoint_id"] == saved.checkpoint_id
    [invoked] = parts.emitter.of_type(EventType.INVOKED)
    assert invoked.data_as(ToolInvoked).resumed_from_checkpoint_id == saved.checkpoint_id


async def test_resuming_from_another_invocations_checkpoint_is_resume_failed() -> None:
    parts = rig()
    foreign = checkpoint(str(uuid.uuid4()))
    await parts.checkpoints.save(foreign)
    config = CheckpointConfig(resume_from_checkpoint_id=foreign.checkpoint_id)
    topic, data = await outcome(
        parts, authorized("test__cached", {"key": "x"}, checkpoint_config=config)
    )
    assert topic is TopicName.RESULTS
    assert status_of(data) == "resume_failed"
    assert parts.emitter.emitted == []


# -- reads ahead ------------------------------------------------------------------


@dataclass
class RoundTrips:
    """Wraps a twin's method in a round trip the log sees sent and answered."""

    log: list[str] = field(default_factory=list)

    def wrap(self, name: str, read: Any) -> Any:
        async def round_trip(*args: Any, **kwargs: Any) -> Any:
            self.log.append(f"{name} sent")
            for _ in range(3):  # the wire: other tasks run meanwhile
                await asyncio.sleep(0)
            answer = await read(*args, **kwargs)
            self.log.append(f"{name} answered")
            return answer

        return round_trip


def timed_rig() -> tuple[Rig, RoundTrips]:
    parts, trips = rig(), RoundTrips()
    parts.circuits.load = trips.wrap("circuit", parts.circuits.load)  # type: ignore[method-assign]
    parts.slots.try_acquire = trips.wrap("slot", parts.slots.try_acquire)  # type: ignore[method-assign]
    parts.checkpoints.latest = trips.wrap("checkpoint", parts.checkpoints.latest)  # type: ignore[method-assign]
    return parts, trips


async def test_the_checkpoint_is_read_while_the_circuit_and_the_slot_are() -> None:
    parts, trips = timed_rig()
    _, data = await outcome(parts, authorized("test__cached", {"key": uuid.uuid4().hex}))
    assert status_of(data) == "success"
    # The circuit decides before the slot is taken; the checkpoint waits for neither.
    assert trips.log[:2] == ["circuit sent", "checkpoint sent"]
    assert trips.log.index("slot sent") > trips.log.index("circuit answered")


async def test_a_read_ahead_that_fails_fails_the_call_at_its_gate() -> None:
    parts, trips = timed_rig()

    async def durable_tier_down(call: CallKey) -> Checkpoint | None:
        raise ConnectionError("postgres is away")

    parts.checkpoints.latest = trips.wrap("checkpoint", durable_tier_down)  # type: ignore[method-assign]
    key = uuid.uuid4().hex
    with pytest.raises(ConnectionError):
        await parts.service.on_authorized(authorized("test__cached", {"key": key}))
    assert sample_tools.RUNS[f"cached:{key}"] == 0
    assert parts.slots.held[agent_key(TENANT, AGENT)] == {}  # released on the way out


@pytest.mark.parametrize("fails", ["at once", "after a round trip"])
async def test_a_call_stopped_before_its_checkpoint_is_judged_drops_the_read_quietly(
    fails: str,
) -> None:
    parts, trips = timed_rig()

    async def durable_tier_down(call: CallKey) -> Checkpoint | None:
        trips.log.append("checkpoint sent")
        raise ConnectionError("postgres is away")

    read = durable_tier_down if fails == "at once" else trips.wrap("checkpoint", durable_tier_down)
    parts.checkpoints.latest = read  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    try:
        # Refused at the credentials gate (no connection), after the read went out.
        topic, data = await outcome(parts, authorized("test__secret_user"))
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert "checkpoint sent" in trips.log
    assert (topic, status_of(data)) == (TopicName.RESULTS, "permission_denied")
    assert unretrieved == []


# -- the run's exit stack ---------------------------------------------------------


async def test_a_failing_emitter_still_releases_the_slot_and_revokes_credentials(
    capabilities: list[CredentialCapability],
) -> None:
    parts = rig()
    parts.emitter.fail_on = EventType.INVOKED
    with pytest.raises(EmitterDown):
        await parts.service.on_authorized(authorized("test__secret_user", connection_id="conn1"))
    assert parts.slots.held[agent_key(TENANT, AGENT)] == {}
    [capability] = capabilities
    with pytest.raises(PermissionDenied):
        capability.get("api_key")
    assert parts.service.state.running == {}


# -- the lease ----------------------------------------------------------------------


def leased() -> tuple[Rig, MemoryLeases]:
    clock = ManualClock()
    leases = MemoryLeases(ttl_s=30, clock=clock)
    return rig(clock, lease_guard=LeaseGuard(leases=leases, worker_id="w")), leases


async def test_a_redelivered_finished_call_replays_its_outcome_without_running() -> None:
    parts, leases = leased()
    key = uuid.uuid4().hex
    event = authorized("test__cached", {"key": key}, max_concurrent_per_agent=1)
    first = await parts.service.on_authorized(event)
    parts.cache.entries.clear()  # nothing but the lease's record can answer again
    again = await parts.service.on_authorized(event)
    assert [(t, e.id) for t, e in again] == [(t, e.id) for t, e in first]
    assert sample_tools.RUNS[f"cached:{key}"] == 1
    assert leases.leases == {}  # finished: the lease is gone, the record stays


async def test_the_slots_release_overlaps_the_leases_finish() -> None:
    parts, leases = leased()
    trips = RoundTrips()
    parts.slots.release = trips.wrap("slot release", parts.slots.release)  # type: ignore[method-assign]
    leases.finish = trips.wrap("lease finish", leases.finish)  # type: ignore[method-assign]
    _, data = await outcome(parts, authorized("test__cached", {"key": uuid.uuid4().hex}))
    assert status_of(data) == "success"
    # Both on the wire before either is answered; the outcome waited for both.
    assert sorted(trips.log[:2]) == ["lease finish sent", "slot release sent"]
    assert sorted(trips.log[2:]) == ["lease finish answered", "slot release answered"]
    assert parts.slots.held[agent_key(TENANT, AGENT)] == {}


async def test_a_slot_release_that_fails_fails_the_delivery_and_the_next_one_replays() -> None:
    parts, _ = leased()

    async def redis_away(agent_key: str, holder: str) -> None:
        raise ConnectionError("redis is away")

    parts.slots.release = redis_away  # type: ignore[method-assign]
    key = uuid.uuid4().hex
    event = authorized("test__cached", {"key": key})
    with pytest.raises(ConnectionError):
        await parts.service.on_authorized(event)
    # The lease recorded the outcome before the release failed: it is not run again.
    [(topic, env)] = await parts.service.on_authorized(event)
    assert (topic, status_of(env.data)) == (TopicName.EXECUTED, "success")
    assert sample_tools.RUNS[f"cached:{key}"] == 1


async def test_a_failing_emitter_under_a_lease_leaves_the_call_to_run_again() -> None:
    parts, leases = leased()
    key = uuid.uuid4().hex
    event = authorized("test__cached", {"key": key})
    parts.emitter.fail_on = EventType.INVOKED
    with pytest.raises(EmitterDown):
        await parts.service.on_authorized(event)
    assert leases.done == {}  # no outcome was claimed
    assert parts.slots.held[agent_key(TENANT, AGENT)] == {}
    parts.emitter.fail_on = None
    parts.clock.advance(30)  # the failed run's lease lapses (an error leaves it to its TTL)
    [(topic, env)] = await parts.service.on_authorized(event)  # the redelivery runs it
    assert topic is TopicName.EXECUTED
    assert env.data["execution_metadata"]["attempts"] == 2  # second run of the call


# -- acks -------------------------------------------------------------------------


@dataclass
class HeldAcks(Emitter):
    """Acknowledges nothing until the test says so."""

    pending: list[asyncio.Future[object]] = field(default_factory=list)

    async def emit(self, topic: TopicName, envelope: Envelope) -> Awaitable[object]:
        self.emitted.append((topic, envelope))
        ack: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.pending.append(ack)
        return ack


async def settle_until(done: Any) -> None:
    for _ in range(200):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


def leased_with(emitter: HeldAcks) -> tuple[Rig, MemoryLeases]:
    parts, leases = leased()
    parts.emitter = emitter
    parts.service = replace(parts.service, ports=replace(parts.service.ports, emitter=emitter))
    return parts, leases


async def test_the_outcome_waits_for_the_invoked_ack_which_is_awaited_as_the_lease_finishes() -> (
    None
):
    emitter = HeldAcks()
    parts, leases = leased_with(emitter)
    key = uuid.uuid4().hex
    event = authorized("test__cached", {"key": key})
    running = asyncio.create_task(parts.service.on_authorized(event))
    # The lease's finish (the outcome claimed) does not wait for the ack, one round trip
    # fewer in a row; the outcome is not handed on before it.
    await settle_until(lambda: call_of(event) in leases.done)
    assert not running.done()
    [invoked] = emitter.pending
    invoked.set_result(None)
    [(topic, env)] = await running
    assert topic is TopicName.EXECUTED
    assert env.data["result"] is not None
    assert sample_tools.RUNS[f"cached:{key}"] == 1


async def test_an_invoked_ack_that_fails_fails_the_delivery_and_the_next_one_replays() -> None:
    emitter = HeldAcks()
    parts, _ = leased_with(emitter)
    key = uuid.uuid4().hex
    event = authorized("test__cached", {"key": key})
    running = asyncio.create_task(parts.service.on_authorized(event))
    await settle_until(lambda: emitter.pending)
    emitter.pending[0].set_exception(EmitterDown("the broker refused the send"))
    with pytest.raises(EmitterDown):
        await running
    [(topic, _)] = await parts.service.on_authorized(event)  # redelivered
    assert topic is TopicName.EXECUTED
    assert sample_tools.RUNS[f"cached:{key}"] == 1  # replayed, not run again


# -- the circuit, reported as the lease finishes ------------------------------------


@dataclass
class HeldSwaps:
    """A circuit store whose writes wait until the test lets them through."""

    store: MemoryCircuitStore
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    swaps: int = 0
    fail: bool = False

    async def swap(self, name: str, expected: str, new: str, transition: str) -> bool:
        self.swaps += 1
        await self.gate.wait()
        if self.fail:
            raise ConnectionError("redis is away")
        return await MemoryCircuitStore.swap(self.store, name, expected, new, transition)


def held_swaps(parts: Rig) -> HeldSwaps:
    held = HeldSwaps(parts.circuits)
    parts.circuits.swap = held.swap  # type: ignore[method-assign]
    return held


async def test_the_last_attempts_circuit_report_overlaps_the_leases_finish() -> None:
    parts, leases = leased()
    held = held_swaps(parts)
    event = authorized("test__cached", {"key": uuid.uuid4().hex})
    running = asyncio.create_task(parts.service.on_authorized(event))
    # The outcome is claimed while the circuit's write is held on the wire...
    await settle_until(lambda: held.swaps == 1 and call_of(event) in leases.done)
    # ...and is not handed on before the write is answered.
    for _ in range(10):
        await asyncio.sleep(0)
    assert not running.done()
    held.gate.set()
    [(topic, env)] = await running
    assert (topic, status_of(env.data)) == (TopicName.EXECUTED, "success")
    assert circuit_state(parts, "test__cached").window == (0,)  # the success was counted


async def test_a_circuit_report_that_fails_fails_the_delivery_and_the_next_one_replays() -> None:
    parts, _ = leased()
    held = held_swaps(parts)
    held.fail = True
    held.gate.set()
    key = uuid.uuid4().hex
    event = authorized("test__cached", {"key": key})
    with pytest.raises(ConnectionError):
        await parts.service.on_authorized(event)
    # The lease recorded the outcome before the report failed: the tool does not run again
    # (had it not, the redelivery would wait for the failed run's lease to lapse).
    async with asyncio.timeout(5):
        [(topic, env)] = await parts.service.on_authorized(event)
    assert (topic, status_of(env.data)) == (TopicName.EXECUTED, "success")
    assert sample_tools.RUNS[f"cached:{key}"] == 1


async def test_a_transition_the_last_report_causes_is_acknowledged_before_the_outcome() -> None:
    emitter = HeldAcks()
    parts, _ = leased_with(emitter)
    for _ in range(2):  # window 4, minimum 3 calls, 50 % failures: the third opens it
        running = asyncio.create_task(
            parts.service.on_authorized(authorized("test__breaker", {"fail": True}))
        )
        await settle_until(lambda: emitter.pending)
        emitter.pending.pop().set_result(None)  # its invoked
        await running
    running = asyncio.create_task(
        parts.service.on_authorized(authorized("test__breaker", {"fail": True}))
    )
    await settle_until(lambda: emitter.pending)
    emitter.pending.pop().set_result(None)  # its invoked
    await settle_until(lambda: emitter.of_type(EventType.CIRCUIT_OPENED))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not running.done()  # the outcome waits for circuit.opened's ack
    emitter.pending[-1].set_result(None)
    [(_, env)] = await running
    assert status_of(env.data) == "external_api_error"
    assert circuit_state(parts, "test.breaker").status is CircuitStatus.OPEN
