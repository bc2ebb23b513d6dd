"""Micro-benchmark of the executor's handling of one ``core__echo`` invocation.

    python bench/executor_call_bench.py [--n 4000] [--tenants 50] [--concurrency 200]
    python bench/executor_call_bench.py --profile /tmp/executor.prof

Drives :meth:`ExecutorService.on_authorized` directly (no Kafka) for N signed
``invoke.authorized`` events of ``core__echo``, built as the executor's handler builds
the service: leases with fencing, cancel flags, agent slots, circuit breaker, result
cache, hot (Redis) and durable (Postgres) checkpoints, document pins, grant verification
and the cached revocation list; the producer is an in-memory twin whose acks are already done.
Calls run like the consumer runs them: ``--concurrency`` in flight, spread evenly over
``--tenants`` (one agent each, its default limit of 4 running calls).

Reports the process CPU (user + system) per call, and the Redis commands and writes
(pipelines or single commands sent) per call. Redis is a ``redis-server`` started here
on a free port, so its ``INFO commandstats`` counts this run only (``--redis-url`` to
use another, then the counts include whatever else talks to it); Postgres comes from
``TOOLFLEET_DATABASE_URL`` (a throwaway database is created and dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import socket
import subprocess
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.asyncio.connection import AbstractConnection

from toolfleet.auth.grants import GrantSigner, GrantVerifier
from toolfleet.documents.pins import TieredPinBook
from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.identity import CallRef
from toolfleet.events.models import AgentContext, Effect, InvokeAuthorized
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.executor.cache import RedisResultCache
from toolfleet.executor.checkpoints.cold import PostgresCheckpointStore
from toolfleet.executor.checkpoints.store import RedisCheckpointStore, TieredCheckpointStore
from toolfleet.executor.circuits.breaker import CircuitBreaker
from toolfleet.executor.circuits.store import RedisCircuitStore
from toolfleet.executor.concurrency import RedisAgentSlots
from toolfleet.executor.leasing.guard import LeaseGuard
from toolfleet.executor.leasing.leases import RedisLeases
from toolfleet.executor.service import ExecutorConfig, ExecutorPorts, ExecutorService
from toolfleet.registry.catalog import discover
from toolfleet.storage.cancel_flags import RedisCancelFlags
from toolfleet.storage.postgres import create_pool, dsn_with_database, migrate
from toolfleet.storage.redis import connect_redis
from toolfleet.storage.revocation import CachedRevocationList, RedisRevocationList

KEY = b"bench-grant-key-0123456789abcdef"

#: Absent from older executors (the bench also measures the code before the change).
_HAS_TRUST = "trust_lease_reads" in ExecutorConfig.__dataclass_fields__


class _Emitter:
    """The producer's twin: every event is acknowledged at once."""

    def __init__(self) -> None:
        self.emitted = 0

    async def emit(self, topic: TopicName, envelope: Envelope) -> Awaitable[object]:
        self.emitted += 1
        done: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class _Client:
    """Counts what the Redis clients send: commands (a script call is one) and writes
    to a socket (a pipeline is one)."""

    commands = 0
    writes = 0

    @classmethod
    @contextlib.contextmanager
    def counting(cls) -> Iterator[None]:
        # The socket write itself: the fleet's lean connections (``storage/redis.py``)
        # override ``send_packed_command`` but write through this one.
        send, execute, run = (
            AbstractConnection._send_packed_command,
            Pipeline.execute,
            Redis.execute_command,
        )

        async def counted_send(self: AbstractConnection, command: Any) -> None:
            cls.writes += 1
            await send(self, command)

        async def counted_execute(self: Pipeline, raise_on_error: bool = True) -> Any:
            cls.commands += len(self.command_stack)
            return await execute(self, raise_on_error)

        async def counted_run(self: Redis, *args: Any, **options: Any) -> Any:
            cls.commands += 1
            return await run(self, *args, **options)

        AbstractConnection._send_packed_command = counted_send  # type: ignore[method-assign]
        Pipeline.execute = counted_execute  # type: ignore[method-assign]
        Redis.execute_command = counted_run  # type: ignore[method-assign]
        try:
            yield
        finally:
            AbstractConnection._send_packed_command = send  # type: ignore[method-assign]
            Pipeline.execute = execute  # type: ignore[method-assign]
            Redis.execute_command = run  # type: ignore[method-assign]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _own_redis() -> Iterator[str]:
    port = _free_port()
    with tempfile.TemporaryDirectory() as workdir:
        proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                workdir,
                "--bind",
                "127.0.0.1",
            ],
            stdout=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
                    break
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


@contextlib.asynccontextmanager
async def _throwaway_database(admin_url: str) -> AsyncIterator[str]:
    name = f"toolfleet_bench_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = dsn_with_database(admin_url, name)
    try:
        yield url
    finally:
        admin = await asyncpg.connect(admin_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


def authorized(signer: GrantSigner, tenant: str, i: int) -> Envelope:
    """A signed ``invoke.authorized`` of ``core__echo``, as policy emits it."""
    data = InvokeAuthorized(
        invocation_id=uuid.uuid4(),
        tool_id="core__echo",
        tool_version="1.0.0",
        requested_version="*",
        agent_context=AgentContext(agent_did="did:agent:bench", tenant_id=tenant),
        parameters={"message": f"hello {i}"},
        effect=Effect.READ_ONLY,
        timeout_seconds=5,
        requested_at=datetime.now(UTC),
    )
    grant = signer.sign(
        call=CallRef(
            invocation_id=str(data.invocation_id),
            tenant_id=tenant,
            agent_did="did:agent:bench",
            tool_id="core__echo",
            tool_version="1.0.0",
        ),
        parameters=data.parameters,
        capability_jti=f"jti-{tenant}",
        timeout_s=5,
    )
    return new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data=data.model_copy(update={"grant": grant}),
        tenant_id=tenant,
        invocation_id=str(data.invocation_id),
    )


@dataclass(frozen=True, kw_only=True)
class Run:
    calls: int
    cpu_s: float
    wall_s: float
    commands: Counter[str]
    """Commands Redis ran, those inside scripts included (``INFO commandstats``)."""
    sent: int
    """Commands the client sent (a script call is one)."""
    writes: int

    def report(self, label: str) -> str:
        per = self.calls
        top = ", ".join(f"{name} {n / per:.2f}" for name, n in self.commands.most_common())
        return (
            f"{label}: {self.calls} calls, CPU {self.cpu_s / per * 1e6:.0f} us/call, "
            f"wall {self.wall_s / per * 1e6:.0f} us/call, "
            f"Redis: {self.sent / per:.2f} commands/call sent in {self.writes / per:.2f} "
            f"writes/call, {sum(self.commands.values()) / per:.2f} run/call (scripts' "
            f"included)\n    run per call: {top}"
        )


async def _commandstats(redis: Redis) -> Counter[str]:
    stats: dict[str, Any] = await redis.info("commandstats")
    return Counter({name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()})


async def drive(
    service: ExecutorService,
    events: list[Envelope],
    tenants: int,
    concurrency: int,
) -> None:
    """Run ``events`` with ``concurrency`` in flight, the same share for every tenant."""
    lanes: list[list[Envelope]] = [[] for _ in range(concurrency)]
    for i, event in enumerate(events):
        # Lane l serves tenant l % tenants: each tenant has concurrency / tenants lanes.
        tenant = i % tenants
        lane = tenant + tenants * ((i // tenants) % max(concurrency // tenants, 1))
        lanes[lane % concurrency].append(event)

    async def lane_run(mine: list[Envelope]) -> None:
        for event in mine:
            emitted = await service.on_authorized(event)
            if emitted[0][0] is not TopicName.EXECUTED:
                raise RuntimeError(f"call failed: {emitted[0][1].data}")

    await asyncio.gather(*(lane_run(mine) for mine in lanes))


async def main(args: argparse.Namespace, redis_url: str) -> None:
    async with _throwaway_database(args.database_url) as dsn:
        pool = await create_pool(dsn, max_size=10)
        await migrate(pool)
        redis = connect_redis(redis_url)
        stats_client = Redis.from_url(redis_url)
        stop = asyncio.Event()
        revocations = CachedRevocationList(RedisRevocationList(redis, max_ttl_s=3600))
        listener = asyncio.create_task(revocations.listen(redis, stop))
        service = ExecutorService(
            ports=ExecutorPorts(
                catalog=discover([]),
                checkpoints=TieredCheckpointStore(
                    hot=RedisCheckpointStore(redis, ttl_s=3600),
                    cold=PostgresCheckpointStore(pool),
                ),
                cancels=RedisCancelFlags(redis),
                emitter=_Emitter(),
                grants=GrantVerifier([KEY]),
                revocations=revocations,
                slots=RedisAgentSlots(redis),
                breaker=CircuitBreaker(store=RedisCircuitStore(redis), clock=time.time),
                cache=RedisResultCache(redis, cipher=None),
                lease_guard=LeaseGuard(
                    leases=RedisLeases(redis, ttl_s=45), worker_id="bench-worker"
                ),
                # The worker's pin book (the default keeps every call's pins in memory: a twin).
                document_pins=TieredPinBook(redis, pool, ttl_s=3600),
            ),
            config=ExecutorConfig(
                worker_id="bench-worker",
                **({"trust_lease_reads": True} if _HAS_TRUST else {}),
            ),
        )
        signer = GrantSigner(KEY)
        tenants = [f"bench_t{t:03d}" for t in range(args.tenants)]

        def batch(n: int) -> list[Envelope]:
            return [authorized(signer, tenants[i % args.tenants], i) for i in range(n)]

        await drive(service, batch(args.warmup), args.tenants, args.concurrency)
        runs: list[Run] = []
        profiler = cProfile.Profile() if args.profile else None
        for _ in range(args.repeat):
            events = batch(args.n)
            before = await _commandstats(stats_client)
            sent, writes = _Client.commands, _Client.writes
            if profiler is not None:
                profiler.enable()
            cpu, wall = time.process_time(), time.perf_counter()
            with _Client.counting():
                await drive(service, events, args.tenants, args.concurrency)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            if profiler is not None:
                profiler.disable()
            after = await _commandstats(stats_client)
            commands = after - before
            commands.pop("info", None)
            runs.append(
                Run(
                    calls=args.n,
                    cpu_s=cpu,
                    wall_s=wall,
                    commands=commands,
                    sent=_Client.commands - sent,
                    writes=_Client.writes - writes,
                )
            )
            print(runs[-1].report(f"run {len(runs)}"), flush=True)
        best = min(runs, key=lambda r: r.cpu_s)
        print(best.report("best"))
        if profiler is not None:
            profiler.dump_stats(args.profile)
            print(f"profile written to {args.profile}")
        stop.set()
        await asyncio.wait([listener], timeout=2)
        await redis.aclose()
        await stats_client.aclose()
        await pool.close()


def cli() -> None:
    import os

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4000, help="calls per measured run")
    parser.add_argument("--repeat", type=int, default=3, help="measured runs (best is kept)")
    parser.add_argument("--warmup", type=int, default=1000, help="unmeasured calls first")
    parser.add_argument("--tenants", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--redis-url", default=None, help="default: a redis-server of its own")
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "TOOLFLEET_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
        ),
    )
    parser.add_argument("--profile", default=None, help="write cProfile stats of the runs here")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.redis_url or stack.enter_context(_own_redis())
        asyncio.run(main(args, url))


if __name__ == "__main__":
    cli()
