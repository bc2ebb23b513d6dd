"""The executor's backlog: priority classes, fairness across tenants, per-tenant bounds."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from aiokafka import ConsumerRecord
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.support.eventually import eventually
from toolfleet.bus.offsets import Partition
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.bus.runtime import ConsumerSpec, EventConsumer, Inbound
from toolfleet.bus.scheduler import Backlog, Placement
from toolfleet.events.codec import encode
from toolfleet.events.envelope import new_event
from toolfleet.events.types import EventType, Source
from toolfleet.executor.scheduling import placement
from toolfleet.settings import FleetSettings

HIGH, NORMAL, LOW = 0, 1, 2


def drain(backlog: Backlog[str], *, finish: bool = True) -> list[str]:
    """Pop everything startable, finishing each item at once (a worker of one slot)."""
    order: list[str] = []
    while (picked := backlog.pop()) is not None:
        item, tenant = picked
        order.append(item)
        if finish:
            backlog.done(tenant)
    return order


def test_priority_classes_are_strict() -> None:
    backlog: Backlog[str] = Backlog()
    backlog.push("low-1", Placement(LOW, "a"))
    backlog.push("normal-1", Placement(NORMAL, "a"))
    backlog.push("low-2", Placement(LOW, "b"))
    backlog.push("high-1", Placement(HIGH, "c"))
    backlog.push("normal-2", Placement(NORMAL, "b"))
    assert drain(backlog) == ["high-1", "normal-1", "normal-2", "low-1", "low-2"]
    assert len(backlog) == 0


def test_fifo_within_a_tenant() -> None:
    backlog: Backlog[int] = Backlog()
    for i in range(50):
        backlog.push(i, Placement(NORMAL, "a"))
    order = []
    while (picked := backlog.pop()) is not None:
        order.append(picked[0])
        backlog.done(picked[1])
    assert order == list(range(50))


def test_one_tenants_flood_does_not_delay_anothers_call() -> None:
    backlog: Backlog[str] = Backlog()
    for i in range(1000):
        backlog.push(f"a{i}", Placement(NORMAL, "a"))
    backlog.push("b0", Placement(NORMAL, "b"))
    first_two = [backlog.pop(), backlog.pop()]
    assert [p[0] for p in first_two if p] == ["a0", "b0"]


def test_round_robin_over_tenants() -> None:
    backlog: Backlog[str] = Backlog()
    for tenant in "abc":
        for i in range(3):
            backlog.push(f"{tenant}{i}", Placement(NORMAL, tenant))
    assert drain(backlog) == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2", "c2"]


def test_a_tenant_at_its_bound_is_skipped_not_blocking() -> None:
    backlog: Backlog[str] = Backlog(max_running_per_tenant=2)
    for i in range(5):
        backlog.push(f"a{i}", Placement(HIGH, "a"))
    backlog.push("b0", Placement(LOW, "b"))
    started = drain(backlog, finish=False)
    # a runs two; its three other high calls wait; b's low call goes ahead meanwhile
    assert started == ["a0", "a1", "b0"]
    assert backlog.running("a") == 2
    assert backlog.pop() is None
    backlog.done("a")
    assert backlog.pop() == ("a2", "a")
    assert backlog.pop() is None
    assert len(backlog) == 2


def test_bound_counts_running_items_across_classes() -> None:
    backlog: Backlog[str] = Backlog(max_running_per_tenant=1)
    backlog.push("a-normal", Placement(NORMAL, "a"))
    backlog.push("a-high", Placement(HIGH, "a"))
    backlog.push("b-normal", Placement(NORMAL, "b"))
    assert backlog.pop() == ("a-high", "a")
    assert backlog.pop() == ("b-normal", "b")  # a is at its bound in every class
    assert backlog.pop() is None
    backlog.done("a")
    assert backlog.pop() == ("a-normal", "a")


def test_drop_removes_selected_items_and_keeps_order() -> None:
    backlog: Backlog[str] = Backlog(max_running_per_tenant=1)
    for tenant in "ab":
        for i in range(4):
            backlog.push(f"{tenant}{i}", Placement(i % 2, tenant))
    assert backlog.pop() == ("a0", "a")  # a is now at its bound (parked)
    dropped = backlog.drop(lambda item: item.startswith("a") or item.endswith("2"))
    assert sorted(dropped) == ["a1", "a2", "a3", "b2"]
    assert len(backlog) == 3
    assert sorted(backlog) == ["b0", "b1", "b3"]
    backlog.done("a")
    assert drain(backlog) == ["b0", "b1", "b3"]


def test_executor_placement_reads_priority_and_tenant() -> None:
    def event(data: dict[str, object]) -> Placement:
        env = new_event(
            event_type=EventType.INVOKE_AUTHORIZED,
            source=Source.POLICY,
            data=data,
            tenant_id="t_acme",
            invocation_id="i",
        )
        return placement(env)

    assert event({"execution_options": {"priority": "high"}}) == Placement(0, "t_acme")
    assert event({"execution_options": {"priority": "normal"}}) == Placement(1, "t_acme")
    assert event({"execution_options": {"priority": "low"}}) == Placement(2, "t_acme")
    # anything else is normal: the handler, not the scheduler, rejects bad input
    assert event({}) == Placement(1, "t_acme")
    assert event({"execution_options": "x"}) == Placement(1, "t_acme")
    assert event({"execution_options": {"priority": ["high"]}}) == Placement(1, "t_acme")
    assert event({"execution_options": {"priority": "urgent"}}) == Placement(1, "t_acme")


async def _now(value: bool) -> bool:
    return value


class _NoOutput:
    async def send_all(self, outputs: Sequence[Outbound]) -> None:
        assert not outputs


def _record(partition: int, offset: int, tenant: str, rank: int) -> ConsumerRecord[bytes, bytes]:
    env = new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data={"rank": rank},
        tenant_id=tenant,
        invocation_id=f"{partition}-{offset}",
    )
    wire = encode(env)
    return ConsumerRecord(
        topic="t",
        partition=partition,
        offset=offset,
        timestamp=0,
        timestamp_type=0,
        key=wire.key,
        value=wire.value,
        checksum=None,
        serialized_key_size=0,
        serialized_value_size=len(wire.value),
        headers=wire.headers,
    )


async def test_runtime_starts_by_priority_and_drops_queued_records_on_revoke() -> None:
    """The runtime side, offline: queued records start when slots free up, by priority;
    a revoke drops the queued records of its partitions (unfinished, not committed)."""
    started: list[str] = []
    gates: dict[str, asyncio.Event] = {}

    async def handler(event: Inbound) -> Sequence[Outbound]:
        started.append(event.envelope.invocationid or "")
        await gates.setdefault(event.envelope.invocationid or "", asyncio.Event()).wait()
        return []

    spec = ConsumerSpec(
        service="test",
        source="/toolfleet/test",
        group_id="g",
        topics=["t"],
        max_in_flight=1,
        schedule=lambda env: Placement(int(env.data["rank"]), env.tenantid or ""),
    )
    runtime = EventConsumer(
        spec,
        handler,
        settings=FleetSettings(),
        producer=cast(EventProducer, _NoOutput()),
        processed=None,
        dlq_topic="dlq",
    )
    consumer: Any = type("FakeConsumer", (), {"assignment": lambda self: set()})()
    batch = {
        "p0": [_record(0, 0, "a", NORMAL), _record(0, 1, "a", LOW)],
        "p1": [_record(1, 0, "b", NORMAL), _record(1, 1, "b", HIGH)],
    }
    runtime._dispatch_batch(consumer, batch)  # type: ignore[arg-type]
    await eventually(lambda: _now(started == ["1-1"]))  # the high one, though fetched last
    assert runtime.queued == 3

    await runtime.release([Partition("t", 0)])  # p0's two queued records go back
    assert runtime.queued == 1
    gates["1-1"].set()
    await eventually(lambda: _now(started == ["1-1", "1-0"]))
    gates["1-0"].set()
    await eventually(lambda: _now(not runtime._core.tasks))
    assert started == ["1-1", "1-0"]  # nothing of the revoked partition started
    assert runtime.queued == 0
    assert runtime._core.tracker.committable() == {Partition("t", 1): 2}


# --- property: a worker's backlog against a reference model ---------------------------


@dataclass(frozen=True)
class Item:
    seq: int
    rank: int
    tenant: str
    partition: int


TENANTS = st.sampled_from(["a", "b", "c", "d"])
RANKS = st.sampled_from([HIGH, NORMAL, LOW])


class BacklogMachine(RuleBasedStateMachine):
    """A worker with ``SLOTS`` slots and a per-tenant bound, driven at random.

    Checked after every step: no tenant above its bound, no more running than the slots;
    after a fill, no startable item left waiting while a slot is free; every start is of
    the best rank among startable items and the oldest of its tenant in that rank; and,
    within a rank, no tenant starts twice while another one waited, startable, all along.
    """

    SLOTS = 5
    BOUND = 2

    def __init__(self) -> None:
        super().__init__()
        self.backlog: Backlog[Item] = Backlog(max_running_per_tenant=self.BOUND)
        self.queued: list[Item] = []
        self.running: Counter[str] = Counter()
        self.seq = 0
        self.started_since: dict[tuple[int, str], Counter[str]] = {}

    def startable(self) -> list[Item]:
        return [i for i in self.queued if self.running[i.tenant] < self.BOUND]

    @rule(rank=RANKS, tenant=TENANTS, partition=st.integers(0, 2))
    def push(self, rank: int, tenant: str, partition: int) -> None:
        item = Item(self.seq, rank, tenant, partition)
        self.seq += 1
        self.backlog.push(item, Placement(rank, tenant))
        self.queued.append(item)

    @precondition(lambda self: sum(self.running.values()) < self.SLOTS)
    @rule()
    def pop_one(self) -> None:
        self._pop()

    @rule()
    def fill(self) -> None:
        """What the runtime does when a slot frees up or records arrive."""
        while sum(self.running.values()) < self.SLOTS:
            if self._pop() is None:
                break
        if sum(self.running.values()) < self.SLOTS:
            assert not self.startable(), "a startable item was left waiting"

    @precondition(lambda self: bool(self.running))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        tenant = data.draw(st.sampled_from(sorted(self.running)))
        self.running[tenant] -= 1
        if not self.running[tenant]:
            del self.running[tenant]
        self.backlog.done(tenant)

    @rule(partition=st.integers(0, 2))
    def revoke(self, partition: int) -> None:
        dropped = self.backlog.drop(lambda item: item.partition == partition)
        expected = [i for i in self.queued if i.partition == partition]
        assert sorted(dropped, key=lambda i: i.seq) == expected
        self.queued = [i for i in self.queued if i.partition != partition]

    def _pop(self) -> Item | None:
        startable = self.startable()
        waiting = {(i.rank, i.tenant) for i in startable}
        picked = self.backlog.pop()
        if picked is None:
            assert not startable, "pop returned nothing while an item could start"
            return None
        item, tenant = picked
        assert tenant == item.tenant
        assert item in startable
        assert item.rank == min(i.rank for i in startable), "priority order broken"
        oldest = min(
            (i for i in self.queued if i.rank == item.rank and i.tenant == tenant),
            key=lambda i: i.seq,
        )
        assert item == oldest, "FIFO within a tenant broken"
        for rank, other in waiting:
            if rank == item.rank and other != tenant:
                seen = self.started_since.setdefault((rank, other), Counter())
                seen[tenant] += 1
                assert seen[tenant] <= 1, f"{tenant} started twice while {other} waited"
        self.started_since.pop((item.rank, tenant), None)
        self.queued.remove(item)
        self.running[tenant] += 1
        return item

    @invariant()
    def bounds_hold(self) -> None:
        assert all(n <= self.BOUND for n in self.running.values())
        assert sum(self.running.values()) <= self.SLOTS
        assert len(self.backlog) == len(self.queued)
        for tenant, count in self.running.items():
            assert self.backlog.running(tenant) == count
        # A tenant that stopped waiting startable starts a new fairness window.
        waiting = {(i.rank, i.tenant) for i in self.startable()}
        for key in list(self.started_since):
            if key not in waiting:
                del self.started_since[key]


BacklogMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60)
test_backlog_against_model = BacklogMachine.TestCase
