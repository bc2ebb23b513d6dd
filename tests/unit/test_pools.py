"""Executor pools' pure parts and twins: names and topics, the routing rows, the SDK and
manifest field, presence and the queued-call index, the status fold, the console."""

from __future__ import annotations

import re
import sys
import types
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from typer.testing import CliRunner

from tests.support.lifecycle import T0, Lifecycle
from toolfleet.api.console.timeline import TimelineMark, timeline
from toolfleet.bus.admin import MemoryTopicAdmin, pool_topic_specs
from toolfleet.bus.topics import TopicMode, load_topic_specs, sync_topics
from toolfleet.cli.main import app
from toolfleet.contract.http import InvocationView
from toolfleet.contract.manifest import ToolManifest
from toolfleet.errors import RegistrationError
from toolfleet.events import routing
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import InvocationStatus, InvokeAuthorized, InvokeRequested
from toolfleet.events.types import (
    DEFAULT_POOL,
    EventType,
    Source,
    check_pool_name,
    pool_of_topic,
    pool_topic,
)
from toolfleet.executor.settings import ExecutorSettings
from toolfleet.sdk import ToolContext, spec_of, tool
from toolfleet.settings import FleetSettings
from toolfleet.status.projection import InvocationRow, apply, fact_of
from toolfleet.storage.pools import (
    ExecutorPresence,
    MemoryPoolPresence,
    MemoryQueuedCalls,
    live_counts,
    queued_call,
    queued_notification,
)

pytestmark = pytest.mark.unit

NOW = datetime(2030, 1, 1, tzinfo=UTC)


# --- names and topics -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "gpu", "eu-west_2", "a" * 32, "0"])
def test_a_pool_name_is_a_short_topic_suffix(name: str) -> None:
    assert check_pool_name(name) == name


@pytest.mark.parametrize("name", ["", "GPU", "gpu.x", "-gpu", "a" * 33, "gpu pool", "ü", "a/b"])
def test_anything_else_is_no_pool_name(name: str) -> None:
    with pytest.raises(ValueError, match="not a pool name"):
        check_pool_name(name)


def test_the_default_pool_keeps_the_authorized_topic_and_others_get_a_suffix() -> None:
    assert pool_topic("tf.", DEFAULT_POOL) == "tf.invoke.authorized"
    assert pool_topic("tf.", "gpu") == "tf.invoke.authorized.gpu"
    for pool in ("default", "gpu", "eu-west_2"):
        assert pool_of_topic("tf.", pool_topic("tf.", pool)) == pool
    for other in ("tf.invoke.results", "tf.invoke.authorized.GPU", "x.invoke.authorized.gpu"):
        assert pool_of_topic("tf.", other) is None
    with pytest.raises(ValueError, match="not a pool name"):
        pool_topic("tf.", "a.b")


def test_observers_subscribe_to_every_pool_topic_and_nothing_else() -> None:
    pattern = routing.subscription_pattern(routing.STATUS_CONSUMER, "tf.")
    assert pattern is not None
    read = re.compile(pattern)
    wanted = [f"tf.{name.value}" for name in routing.STATUS_CONSUMER.topics]
    wanted += [pool_topic("tf.", "gpu"), pool_topic("tf.", "a-b_c")]
    assert all(read.match(name) for name in wanted)
    for other in ("tf.audit", "tf.dlq", "tfXinvoke.authorized.gpu", "tf.invoke.authorized.a.b"):
        assert not read.match(other), other
    assert routing.subscription_pattern(routing.AUDIT_CONSUMER, "tf.") == pattern
    assert routing.subscription_pattern(routing.EXECUTOR_RUNS, "tf.") is None


def test_each_pool_has_a_consumer_group_of_its_own_and_default_keeps_the_old_one() -> None:
    assert routing.pool_group("executor", DEFAULT_POOL) == "executor"
    assert routing.pool_group("executor", "gpu") == "executor.gpu"


def test_a_request_cannot_name_a_pool() -> None:
    request: dict[str, Any] = {
        "tool_id": "acme__render",
        "agent_context": {"agent_did": "did:agent:a", "tenant_id": "t1"},
        "pool": "gpu",
    }
    with pytest.raises(ValidationError, match="pool"):
        InvokeRequested.model_validate(request)
    request.pop("pool")
    request["execution_options"] = {"pool": "gpu"}
    with pytest.raises(ValidationError, match="pool"):
        InvokeRequested.model_validate(request)


def test_a_default_pool_call_is_the_authorized_event_it_was_before_pools() -> None:
    call = Lifecycle().authorized().data_as(InvokeAuthorized)
    assert call.pool == DEFAULT_POOL
    assert "pool" not in call.model_dump(mode="json")
    assert call.model_copy(update={"pool": "gpu"}).model_dump(mode="json")["pool"] == "gpu"


# --- the SDK and the manifest --------------------------------------------------------------


class In(BaseModel):
    x: int


class Out(BaseModel):
    x: int


async def _body(params: In, ctx: ToolContext) -> Out:
    return Out(x=params.x)


def _declare(module: str, **options: Any) -> Any:
    fn = types.FunctionType(_body.__code__, _body.__globals__, "fn")
    fn.__module__ = module
    fn.__annotations__ = dict(_body.__annotations__)
    return tool(
        id="acme__pooled", version="1.0.0", effect="read_only", redaction_allowlist=["x"], **options
    )(fn)


def test_a_tool_names_its_pool_or_takes_its_modules_or_default() -> None:
    module = types.ModuleType("acme_pool_tools")
    sys.modules[module.__name__] = module
    try:
        assert spec_of(_declare(module.__name__)).pool == DEFAULT_POOL
        module.TOOLFLEET_POOL = "gpu"  # type: ignore[attr-defined]
        assert spec_of(_declare(module.__name__)).pool == "gpu"
        declared = spec_of(_declare(module.__name__, pool="cpu-big"))
        assert declared.pool == "cpu-big"
        assert declared.manifest().pool == "cpu-big"
    finally:
        del sys.modules[module.__name__]


def test_a_pool_that_cannot_be_a_topic_suffix_is_refused_at_declaration() -> None:
    with pytest.raises(RegistrationError, match=r"acme__pooled: 'GPU\.1' is not a pool name"):
        _declare(__name__, pool="GPU.1")


def test_the_manifest_carries_a_valid_pool() -> None:
    manifest = spec_of(_declare(__name__, pool="gpu")).manifest()
    assert ToolManifest.model_validate(manifest.model_dump(mode="json")).pool == "gpu"
    with pytest.raises(ValidationError):
        ToolManifest.model_validate({**manifest.model_dump(mode="json"), "pool": "a.b"})
    assert manifest.schema_hash == spec_of(_declare(__name__)).manifest().schema_hash


def test_the_executor_serves_the_pools_its_setting_names() -> None:
    assert ExecutorSettings().pool_list == ["default"]
    assert ExecutorSettings(executor_pools="gpu, default,gpu").pool_list == ["gpu", "default"]
    for bad in ("", " , ", "GPU", "a.b"):
        with pytest.raises(ValidationError):
            ExecutorSettings(executor_pools=bad)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["worker", "policy", "--pool", "gpu"], "only an executor serves pools"),
        (["worker", "executor", "--pool", "GPU"], "not a pool name"),
    ],
)
def test_the_worker_command_takes_pools_for_executors_only(args: list[str], error: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert error in " ".join(result.output.split())


# --- presence and the queued-call index -----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_an_executor_counts_while_it_announces_itself() -> None:
    clock = Clock()
    presence = MemoryPoolPresence(ttl_s=6, clock=clock)
    await presence.announce(ExecutorPresence(worker_id="a", pools=("default", "gpu")))
    await presence.announce(ExecutorPresence(worker_id="b", pools=("default",)))
    assert live_counts(await presence.live()) == {"default": 2, "gpu": 1}
    clock.now += 5
    await presence.announce(ExecutorPresence(worker_id="b", pools=("default",)))
    clock.now += 2  # a's last announcement is 7 s old: gone
    assert live_counts(await presence.live()) == {"default": 1}
    await presence.withdraw("b")
    assert live_counts(await presence.live()) == {}


def _event(pool: str = "gpu", *, timeout_s: float = 30) -> tuple[Envelope, InvokeAuthorized]:
    lc = Lifecycle(tool_id="acme__render")
    event = lc.authorized()
    call = event.data_as(InvokeAuthorized).model_copy(
        update={"pool": pool, "timeout_seconds": timeout_s}
    )
    return event.model_copy(update={"data": call.model_dump(mode="json")}), call


async def test_a_queued_call_is_due_at_its_deadline_and_hidden_while_claimed() -> None:
    event, call = _event(timeout_s=30)
    queued = queued_call(event, call, pool="gpu", reason="no_live_executor")
    assert queued.deadline == event.time + timedelta(seconds=30)  # type: ignore[operator]
    index = MemoryQueuedCalls()
    await index.add(queued)
    await index.add(queued.model_copy(update={"deadline": queued.deadline + timedelta(hours=1)}))
    before = queued.deadline - timedelta(seconds=1)
    assert await index.claim_due(before, limit=10, lease_s=30) == []
    [due] = await index.claim_due(queued.deadline, limit=10, lease_s=30)
    assert due.call == queued.call  # the first deadline stands
    assert (
        await index.claim_due(queued.deadline + timedelta(seconds=29), limit=10, lease_s=30) == []
    )
    again = await index.claim_due(queued.deadline + timedelta(seconds=31), limit=10, lease_s=30)
    assert [q.call for q in again] == [queued.call]  # never dropped: handed out again
    await index.drop(queued.call)
    assert await index.claim_due(queued.deadline + timedelta(days=1), limit=10, lease_s=30) == []


async def test_parked_calls_come_oldest_first_until_unparked() -> None:
    index = MemoryQueuedCalls()
    parked = []
    for _ in range(3):
        event, call = _event()
        entry = queued_call(event, call, pool="gpu", reason="tool_not_loaded", parked_by="w1")
        await index.add(entry)
        parked.append(entry)
    assert [q.call for q in await index.parked(limit=2)] == [q.call for q in parked[:2]]
    await index.unpark(parked[0].call)
    assert [q.call for q in await index.parked(limit=5)] == [q.call for q in parked[1:]]


def test_the_queued_notice_names_the_pool_and_why() -> None:
    event, call = _event()
    queued = queued_call(event, call, pool="gpu", reason="tool_not_loaded", parked_by="w1")
    _, notice = queued_notification(queued, source=Source.EXECUTOR)
    assert notice.type == EventType.INVOKE_QUEUED
    assert notice.data["pool"] == "gpu"
    assert notice.data["reason"] == "tool_not_loaded"
    assert notice.data["worker_id"] == "w1"
    assert (notice.tenantid, notice.invocationid) == (queued.tenant_id, queued.invocation_id)
    assert notice.traceparent == event.traceparent
    # The same call parked again says the same (a redelivery's notice is a duplicate).
    assert queued_notification(queued, source=Source.EXECUTOR)[1].id == notice.id


# --- status ---------------------------------------------------------------------------------


def _fold(events: list[Envelope]) -> InvocationRow:
    row: InvocationRow | None = None
    for event in events:
        fact = fact_of(event, now=NOW)
        assert fact is not None
        row = apply(row, fact)
    assert row is not None
    return row


def _queued(lc: Lifecycle, pool: str, at: float) -> Envelope:
    event, call = _event(pool)
    event = event.model_copy(
        update={
            "invocationid": lc.invocation_id,
            "data": {**event.data, "invocation_id": lc.invocation_id},
        }
    )
    call = event.data_as(InvokeAuthorized)
    _, notice = queued_notification(
        queued_call(event, call, pool=pool, reason="no_live_executor"), source=Source.POLICY
    )
    return notice.model_copy(update={"time": T0 + timedelta(seconds=at)})


def test_a_queued_call_shows_queued_with_its_pool_then_runs() -> None:
    lc = Lifecycle(tool_id="acme__render")
    queued = _fold([lc.requested(at=0), lc.authorized(at=1), _queued(lc, "gpu", at=1.1)])
    assert queued.status is InvocationStatus.QUEUED
    assert queued.current_phase == "queued"
    assert queued.execution_metadata == {"pool": "gpu"}
    assert queued.status_rank == 1
    running = _fold(
        [lc.requested(at=0), lc.authorized(at=1), _queued(lc, "gpu", 1.1), lc.invoked(2)]
    )
    assert running.status is InvocationStatus.RUNNING


def test_the_pool_stays_with_the_outcome_whatever_the_order() -> None:
    lc = Lifecycle(tool_id="acme__render")
    events = [
        lc.requested(at=0),
        lc.authorized(at=1),
        _queued(lc, "gpu", at=1.1),
        lc.invoked(at=2),
        lc.outcome(InvocationStatus.SUCCESS, at=3),
    ]
    rows = [_fold(events), _fold(events[::-1]), _fold([events[4], *events[:4]])]
    for row in rows:
        assert row.status is InvocationStatus.SUCCESS
        assert row.execution_metadata is not None
        assert row.execution_metadata["pool"] == "gpu"
        assert row.execution_metadata["attempts"] == 1
    assert rows[0] == rows[1] == rows[2]


def test_a_late_queued_notice_never_moves_a_call_back() -> None:
    lc = Lifecycle(tool_id="acme__render")
    row = _fold([lc.requested(at=0), lc.invoked(at=2), _queued(lc, "gpu", at=1.1)])
    assert row.status is InvocationStatus.RUNNING
    assert row.current_phase == "running"
    approved = _fold(
        [lc.requested(), lc.approval_requested(), lc.approval(granted=True), _queued(lc, "g", 3)]
    )
    assert approved.status is InvocationStatus.QUEUED  # approved, then waiting for a pool


def test_a_default_pool_call_that_never_waited_shows_no_pool() -> None:
    lc = Lifecycle()
    row = _fold([lc.requested(at=0), lc.authorized(at=1), lc.invoked(at=2)])
    assert row.execution_metadata is None
    fact = fact_of(lc.authorized(at=1), now=NOW)
    assert fact is not None
    assert "pool" not in fact.timeline_detail()


def test_the_console_timeline_says_which_pool_a_call_waited_for() -> None:
    lc = Lifecycle(tool_id="acme__render")
    queued_fact = fact_of(_queued(lc, "gpu", at=1.1), now=NOW)
    assert queued_fact is not None
    marks = [
        TimelineMark(kind="requested", at=T0),
        TimelineMark(kind="authorized", at=T0 + timedelta(seconds=1), detail={"pool": "gpu"}),
        TimelineMark(
            kind="queued", at=T0 + timedelta(seconds=1), detail=queued_fact.timeline_detail()
        ),
    ]
    view = InvocationView(
        invocation_id=uuid.UUID(lc.invocation_id),
        tenant_id=lc.tenant,
        tool_id="acme__render",
        status=InvocationStatus.QUEUED,
        created_at=T0,
        updated_at=T0,
        execution_metadata={"pool": "gpu"},
    )
    steps = timeline(view, marks).steps
    assert [s.label for s in steps] == ["requested", "authorized (pool gpu)", "queued (pool gpu)"]
    assert steps[2].detail == {"pool": "gpu", "reason": "no_live_executor"}


async def test_a_pool_topic_is_made_like_the_authorized_topic() -> None:
    settings = FleetSettings(topic_prefix="tf.", topic_partitions=4, topic_replication=1)
    admin = MemoryTopicAdmin()
    specs = pool_topic_specs(settings, ["gpu", "default", "gpu", "eu"])
    assert [s.name for s in specs] == ["tf.invoke.authorized.eu", "tf.invoke.authorized.gpu"]
    report = await sync_topics(admin, specs, mode=TopicMode.CREATE)
    assert report.created == ["tf.invoke.authorized.eu", "tf.invoke.authorized.gpu"]
    [authorized] = [s for s in load_topic_specs(settings) if s.name == "tf.invoke.authorized"]
    for spec in specs:
        state = admin.topics[spec.name]
        assert (state.partitions, dict(state.config)) == (4, dict(authorized.config))
    with pytest.raises(ValueError, match="not a pool name"):
        pool_topic_specs(settings, ["a.b"])
