"""Issue 32, attacks 2 and 3: a call is ``(tenant_id, invocation_id)`` in Redis.

Tenant A writing under tenant B's invocation id (a cancel flag, a pending approval, an
idempotency owner and outcome, a lease and its done mark, a hot checkpoint) reaches
none of B's state, against the real Redis and its scripts. Then the scripts, with
tenant-scoped keys, against their in-memory twins as the reference model.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from tests.unit.test_approval_expiry import pending_approval
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import CallKey
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.events.outcomes import outcome_event
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.executor.checkpoints.store import Checkpoint, RedisCheckpointStore
from toolfleet.executor.leasing.leases import (
    Finished,
    MemoryLeases,
    OutgoingEvent,
    RedisLeases,
    Taken,
)
from toolfleet.policy.idempotency import ClaimKind
from toolfleet.policy.memory_stores import MemoryIdempotencyStore
from toolfleet.policy.redis_stores import RedisApprovalStore, RedisIdempotencyStore
from toolfleet.storage.cancel_flags import RedisCancelFlags
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration

A, B = "tenant-a", "tenant-b"


@pytest.fixture
async def redis(redis_url: str) -> AsyncIterator[Redis]:
    client = connect_redis(redis_url)
    yield client
    await client.aclose()


def calls() -> tuple[CallKey, CallKey]:
    """Tenant A's and tenant B's call of one invocation id."""
    invocation_id = str(uuid.uuid4())
    return CallKey(tenant_id=A, invocation_id=invocation_id), CallKey(
        tenant_id=B, invocation_id=invocation_id
    )


def outcome(call: CallKey, secret: str) -> ToolOutcome:
    return ToolOutcome(
        invocation_id=uuid.UUID(call.invocation_id),
        status=InvocationStatus.SUCCESS,
        agent_did=f"did:agent:{call.tenant_id}",
        tenant_id=call.tenant_id,
        tool_id="core__echo",
        tool_version="1.0.0",
        result={"stdout": secret},
    )


async def test_a_cancel_flag_of_tenant_a_does_not_cancel_tenant_bs_call(redis: Redis) -> None:
    a, b = calls()
    flags = RedisCancelFlags(redis)
    await flags.request(a)
    assert await flags.is_requested(a)
    assert not await flags.is_requested(b)


async def test_tenant_a_parking_an_approval_under_bs_id_leaves_bs_approval(
    redis: Redis,
) -> None:
    a, b = calls()
    store = RedisApprovalStore(redis, prefix=f"test:{uuid.uuid4().hex}:")
    theirs = pending_approval().model_copy(update={"tenant_id": B, "parameters_hash": "b"})
    mine = pending_approval().model_copy(update={"tenant_id": A, "parameters_hash": "a"})
    await store.put(b, theirs, 3600)
    await store.put(a, mine, 3600)  # used to replace B's pending approval
    assert await store.peek(b) == theirs
    assert await store.take(a) == mine
    assert await store.take(b) == theirs  # B's approval still decides B's call
    assert await store.take(b) is None


async def test_tenant_a_owning_a_key_under_bs_running_id_never_gets_bs_outcome(
    redis: Redis,
) -> None:
    """Attack 3: A claims an idempotency key under B's running id, then sends a
    duplicate; B's outcome must not become the answer to A's duplicate."""
    a, b = calls()
    store = RedisIdempotencyStore(redis, prefix=f"test:{uuid.uuid4().hex}:")
    claim = await store.claim(A, "idem-1", a.invocation_id, "h")
    assert claim.kind is ClaimKind.NEW
    duplicate = str(uuid.uuid4())
    dup = await store.claim(A, "idem-1", duplicate, "h")
    assert (dup.kind, dup.outcome_json) == (ClaimKind.DUPLICATE, None)
    assert await store.add_waiter(a, duplicate, "{}") is None
    # B's call of the same id ends: it owns no key of A's, and answers none of A's waiters.
    assert await store.owns_keys([b]) == [False]
    assert await store.finish(b, outcome(b, "B's secret").model_dump_json()) == []
    late = await store.claim(A, "idem-1", str(uuid.uuid4()), "h")
    assert (late.kind, late.outcome_json) == (ClaimKind.DUPLICATE, None)
    # A's own outcome is what its duplicates get.
    mine = outcome(a, "A's own").model_dump_json()
    waiters = await store.finish(a, mine)
    assert [w.invocation_id for w in waiters] == [duplicate]
    again = await store.claim(A, "idem-1", str(uuid.uuid4()), "h")
    assert again.outcome_json == mine


async def test_a_finished_call_of_tenant_a_is_not_replayed_as_tenant_bs(redis: Redis) -> None:
    a, b = calls()
    leases = RedisLeases(redis, ttl_s=5)
    taken = await leases.acquire(a, "worker-1")
    assert isinstance(taken, Taken)
    events = [OutgoingEvent(topic=TopicName.RESULTS, envelope=_envelope(a))]
    assert await leases.finish(taken.fence, events)
    assert isinstance(await leases.acquire(a, "worker-2"), Finished)  # A's redelivery
    # B's call of the same id is B's own: it runs, and A's outcome is not replayed to it.
    theirs = await leases.acquire(b, "worker-2")
    assert isinstance(theirs, Taken)
    assert theirs.fence.run == 1
    assert theirs.seen is not None
    assert theirs.seen.hot_checkpoint is None


async def test_a_hot_checkpoint_of_tenant_a_is_not_tenant_bs(redis: Redis) -> None:
    a, b = calls()
    store = RedisCheckpointStore(redis)
    await store.save(
        Checkpoint(
            checkpoint_id="c-a",
            invocation_id=a.invocation_id,
            tenant_id=A,
            state={"secret": "A's"},
            progress_percent=50,
            current_phase="p",
            timestamp=datetime.now(UTC),
        )
    )
    assert await store.latest(b) is None
    leased = await RedisLeases(redis, ttl_s=5).acquire(b, "w")
    assert isinstance(leased, Taken)
    assert leased.seen is not None
    assert leased.seen.hot_checkpoint is None


def _envelope(call: CallKey) -> Envelope:
    parent = Envelope(id=str(uuid.uuid4()), source="/t", type=EventType.INVOKE_REQUESTED)
    return outcome_event(parent, Source.EXECUTOR, outcome(call, "A's"))


# --- the scripts against their twins, two tenants sharing invocation ids ----------------

_ops = st.lists(
    st.tuples(
        st.sampled_from(["claim", "finish", "wait", "owns"]),
        st.sampled_from([A, B]),
        st.integers(0, 2),  # which of three invocation ids
        st.sampled_from(["k1", "k2"]),
        st.sampled_from(["h1", "h2"]),
    ),
    min_size=1,
    max_size=30,
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_ops)
async def test_idempotency_scripts_match_the_reference_model(
    redis: Redis, ops: list[tuple[str, str, int, str, str]]
) -> None:
    remote = RedisIdempotencyStore(redis, prefix=f"test:{uuid.uuid4().hex}:")
    model = MemoryIdempotencyStore()
    ids = [str(uuid.uuid4()) for _ in range(3)]
    for n, (op, tenant, which, key, digest) in enumerate(ops):
        call = CallKey(tenant_id=tenant, invocation_id=ids[which])
        if op == "claim":
            got = await remote.claim(tenant, key, call.invocation_id, digest)
            want = await model.claim(tenant, key, call.invocation_id, digest)
            assert (got.kind, got.first_invocation_id, got.outcome_json) == (
                want.kind,
                want.first_invocation_id,
                want.outcome_json,
            )
        elif op == "finish":
            done = f'{{"n": {n}, "tenant": "{tenant}"}}'
            assert await remote.finish(call, done) == await model.finish(call, done)
        elif op == "wait":
            waiter = str(uuid.uuid4())
            answers = []
            for store in (remote, model):
                try:
                    answers.append(await store.add_waiter(call, waiter, "{}"))
                except LookupError:
                    answers.append("unknown")
            assert answers[0] == answers[1]
        else:
            # Remote answers True for owners claimed in this process (no round trip);
            # it may say True where the model says False, never the other way round.
            got_owns, want_owns = await remote.owns_keys([call]), await model.owns_keys([call])
            assert got_owns[0] or not want_owns[0]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["acquire", "finish"]), st.sampled_from([A, B])),
        min_size=1,
        max_size=12,
    )
)
async def test_lease_scripts_match_the_reference_model(
    redis: Redis, ops: list[tuple[str, str]]
) -> None:
    remote, model = RedisLeases(redis, ttl_s=60), MemoryLeases(ttl_s=60)
    invocation_id = str(uuid.uuid4())  # one id, two tenants
    fences: dict[str, dict[str, object]] = {"remote": {}, "model": {}}
    for op, tenant in ops:
        call = CallKey(tenant_id=tenant, invocation_id=invocation_id)
        if op == "acquire":
            got, want = await remote.acquire(call, "w"), await model.acquire(call, "w")
            assert type(got) is type(want)
            if isinstance(got, Taken) and isinstance(want, Taken):
                assert got.fence.run == want.fence.run
                assert got.fence.call == want.fence.call == call
                fences["remote"][tenant], fences["model"][tenant] = got.fence, want.fence
        elif tenant in fences["remote"]:
            finished = [
                await remote.finish(fences["remote"][tenant], []),  # type: ignore[arg-type]
                await model.finish(fences["model"][tenant], []),  # type: ignore[arg-type]
            ]
            assert finished[0] == finished[1]
