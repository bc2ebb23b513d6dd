"""Policy's own CPU and Redis commands per invocation, in one process.

    python bench/policy_call_bench.py [--n 4000] [--tenants 50] [--concurrency 200]
                                      [--rounds 3] [--scenario e2e|full|both]

Drives :meth:`PolicyService.on_requested` for N requests, ``--concurrency`` in flight,
and then :meth:`PolicyService.on_results` on their outcomes, ``--concurrency`` at a time
(a fetch's worth), as policy's consumers would: the service is
built as ``policy/handler.py`` builds it (Postgres registry and policy store, Redis
policy cache, cached revocation list following ``token:revocations``, Redis rate
limiter, invocation-id claims, idempotency and approval stores, RS256 capability
tokens, an HMAC grant signer), against the local Redis and a throwaway Postgres
database. Kafka is left out: what the service emits goes to an in-memory producer twin
(a list), so the figures are policy's own handling, without decoding and producing.

Scenarios:

- ``e2e``: what ``bench/e2e_bench.py`` sends: ``core__echo`` over T tenants, one token
  per tenant, the wildcard policy ``allow_tools: [core__*]``, no idempotency key, no
  rate limit.
- ``full``: each tenant its own policy with tenant and tool rate limits (high enough
  never to refuse) and budgets, and every request an idempotency key.

Reported per phase (``requested``: the invoke requests; ``result``: the terminal
outcome of each, as read back from ``invoke.results``): CPU (user + system of this
process) in µs per request, Redis commands and Redis round trips per request (counted
in the client: a pipeline is one round trip of its commands; the pub/sub listeners
are not counted). Each round uses new invocation ids and keys; caches stay warm
between rounds, as in a running worker. The best round of ``--rounds`` is reported.

Environment: ``TOOLFLEET_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) and
``TOOLFLEET_DATABASE_URL`` (an admin DSN; default
``postgresql://postgres@127.0.0.1:5432/postgres``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from e2e_bench import throwaway_database
from toolfleet.auth.grants import GrantSigner
from toolfleet.auth.keys import generate_key_pair
from toolfleet.auth.tokens import TokenIssuer, TokenVerifier
from toolfleet.events.envelope import Emitted, Envelope, new_event
from toolfleet.events.models import (
    AgentContext,
    ExecutionMetadata,
    ExecutionOptions,
    InvocationStatus,
    InvokeRequested,
    ToolOutcome,
)
from toolfleet.events.outcomes import outcome_event
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.policy.cache import RedisPolicyCache, run_invalidation_listener
from toolfleet.policy.claims import RedisInvocationClaims
from toolfleet.policy.documents import Budgets, TenantPolicy
from toolfleet.policy.postgres_policies import PolicyStore
from toolfleet.policy.provider import PolicyProvider
from toolfleet.policy.redis_stores import (
    RedisApprovalStore,
    RedisIdempotencyStore,
    RedisRateLimiter,
)
from toolfleet.policy.service import PolicyService
from toolfleet.registry.lookup import ToolLookup
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.registry.store import RegistryStore
from toolfleet.sdk import spec_of
from toolfleet.sdk.builtin import echo
from toolfleet.storage.cancel_flags import RedisCancelFlags
from toolfleet.storage.postgres import create_pool, migrate
from toolfleet.storage.redis import connect_redis
from toolfleet.storage.revocation import CachedRevocationList, RedisRevocationList

AGENT = "did:agent:bench"
SCENARIOS = ("e2e", "full")


# --- counting Redis traffic in the client ---------------------------------------------


@dataclass
class RedisMeter:
    commands: int = 0
    round_trips: int = 0


METER = RedisMeter()


def count_redis_traffic() -> None:
    """Count every command and round trip of every client of this process."""
    single = Redis.execute_command
    batch = Pipeline.execute

    async def execute_command(self: Redis, *args: Any, **options: Any) -> Any:
        if not isinstance(self, Pipeline) or self.watching:
            METER.commands += 1
            METER.round_trips += 1
        return await single(self, *args, **options)

    async def execute(self: Pipeline, raise_on_error: bool = True) -> list[Any]:
        stack = len(self.command_stack)
        if stack:
            METER.commands += stack + (2 if self.is_transaction else 0)
            METER.round_trips += 1
        return await batch(self, raise_on_error)

    Redis.execute_command = execute_command  # type: ignore[method-assign]
    Pipeline.execute = execute  # type: ignore[method-assign]


# --- the fleet policy sees -------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Phase:
    cpu_us: float
    commands: float
    round_trips: float


@dataclass(frozen=True, kw_only=True)
class Round:
    requested: Phase
    result: Phase
    emitted: dict[str, int]


def tenant_of(i: int, tenants: int) -> str:
    return f"bench_t{i % tenants:03d}"


def full_policy() -> TenantPolicy:
    return TenantPolicy(
        allow_tools=["core__*"],
        deny_tools=["core__run_python"],
        budgets=Budgets(max_calls_per_minute=10_000_000, max_runtime_ms=60_000),
        tool_budgets={
            "core__echo": Budgets(max_calls_per_minute=10_000_000, max_result_bytes=1 << 20)
        },
    )


async def drive(
    items: Sequence[Envelope], concurrency: int, call: Callable[[Envelope], Awaitable[int]]
) -> int:
    """Run ``call`` over ``items`` with ``concurrency`` in flight; total emitted."""
    queue = iter(items)
    total = 0

    async def lane() -> None:
        nonlocal total
        for item in queue:
            total += await call(item)

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return total


def measured(before_cpu: float, before: RedisMeter, n: int) -> Phase:
    return Phase(
        cpu_us=(time.process_time() - before_cpu) * 1e6 / n,
        commands=(METER.commands - before.commands) / n,
        round_trips=(METER.round_trips - before.round_trips) / n,
    )


class Bench:
    def __init__(
        self, service: PolicyService, tokens: dict[str, str], *, scenario: str, tenants: int
    ) -> None:
        self.service = service
        self.tokens = tokens
        self.scenario = scenario
        self.tenants = tenants
        self.producer: list[Emitted] = []  # the in-memory producer twin

    def requests(self, n: int) -> list[Envelope]:
        events = []
        for i in range(n):
            tenant = tenant_of(i, self.tenants)
            key = f"bench-{uuid.uuid4().hex}" if self.scenario == "full" else None
            data = InvokeRequested(
                invocation_id=uuid.uuid4(),
                tool_id="core__echo",
                tool_version="^1.0",
                agent_context=AgentContext(agent_did=AGENT, tenant_id=tenant),
                parameters={"message": f"hello {i}"},
                capability_token=self.tokens[tenant],
                execution_options=ExecutionOptions(idempotency_key=key),
            )
            events.append(
                new_event(
                    event_type=EventType.INVOKE_REQUESTED,
                    source=Source.CLIENT,
                    data=data,
                    tenant_id=tenant,
                    invocation_id=str(data.invocation_id),
                    traceparent=f"00-{uuid.uuid4().hex}-{uuid.uuid4().hex[:16]}-01",
                )
            )
        return events

    def outcomes(self, emitted: Sequence[Emitted]) -> list[Envelope]:
        """What the validator puts on ``invoke.results`` for each authorized call."""
        events = []
        for topic, authorized in emitted:
            if topic is not TopicName.AUTHORIZED:
                continue
            data = authorized.data
            outcome = ToolOutcome(
                invocation_id=uuid.UUID(data["invocation_id"]),
                status=InvocationStatus.SUCCESS,
                agent_did=data["agent_context"]["agent_did"],
                tenant_id=data["agent_context"]["tenant_id"],
                tool_id=data["tool_id"],
                tool_version=data["tool_version"],
                result={"message": data["parameters"]["message"], "length": 11},
                execution_metadata=ExecutionMetadata(duration_ms=3, worker_id="bench-worker"),
            )
            events.append(outcome_event(authorized, Source.VALIDATOR, outcome))
        return events

    async def round(self, n: int, concurrency: int) -> Round:
        requests = self.requests(n)
        self.producer.clear()

        async def requested(event: Envelope) -> int:
            key = (event.tenantid or "").encode()
            emitted = await self.service.on_requested(event, key)
            self.producer.extend(emitted)
            return len(emitted)

        cpu, redis = time.process_time(), RedisMeter(METER.commands, METER.round_trips)
        await drive(requests, concurrency, requested)
        on_requested = measured(cpu, redis, n)
        emitted = {str(topic): 0 for topic, _ in self.producer}
        for topic, _ in self.producer:
            emitted[str(topic)] += 1
        results = self.outcomes(self.producer)

        cpu, redis = time.process_time(), RedisMeter(METER.commands, METER.round_trips)
        for at in range(0, len(results), concurrency):  # a fetch at a time, as consumed
            self.producer.extend(await self.service.on_results(results[at : at + concurrency]))
        on_result = measured(cpu, redis, max(1, len(results)))
        return Round(requested=on_requested, result=on_result, emitted=emitted)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    count_redis_traffic()
    redis_url = os.environ.get("TOOLFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")
    admin = os.environ.get(
        "TOOLFLEET_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
    )
    pair = generate_key_pair()
    issuer = TokenIssuer(pair.private_pem, issuer="toolfleet", audience="toolfleet-bench")
    tokens = {
        tenant_of(i, args.tenants): issuer.issue(
            tenant_id=tenant_of(i, args.tenants), agent_did=AGENT, tool_id="core__*"
        )
        for i in range(args.tenants)
    }
    report: dict[str, Any] = {"n": args.n, "tenants": args.tenants, "concurrency": args.concurrency}
    async with throwaway_database(admin) as database_url:
        pool = await create_pool(database_url, max_size=10)
        redis = connect_redis(redis_url, max_connections=64)
        stop = asyncio.Event()
        try:
            await migrate(pool)
            await RegistryStore(pool).register(spec_of(echo).manifest())
            store = PolicyStore(pool)
            prefix = f"bench:{uuid.uuid4().hex[:8]}:"
            for scenario in SCENARIOS if args.scenario == "both" else (args.scenario,):
                # Tenants are per scenario so that each has its own policies.
                names = {tenant_of(i, args.tenants) for i in range(args.tenants)}
                if scenario == "e2e":
                    await store.put("*", TenantPolicy(allow_tools=["core__*"]), "bench")
                else:
                    for tenant in names:
                        await store.put(tenant, full_policy(), "bench")
                cache = RedisPolicyCache(redis)
                for tenant in [*names, "*"]:
                    await cache.announce(tenant)
                provider = PolicyProvider(store, shared=cache)
                revocations = CachedRevocationList(RedisRevocationList(redis))
                subscribed = [asyncio.Event(), asyncio.Event()]
                listeners = [
                    asyncio.create_task(
                        run_invalidation_listener(redis, provider, stop, subscribed=subscribed[0])
                    ),
                    asyncio.create_task(revocations.listen(redis, stop, subscribed=subscribed[1])),
                ]
                await asyncio.gather(*(s.wait() for s in subscribed))
                limiter = RedisRateLimiter(redis, prefix=prefix)
                idempotency = RedisIdempotencyStore(redis, prefix=prefix)
                service = PolicyService(
                    **_admission(limiter, idempotency),
                    lookup=ToolLookup(RegistryStore(pool), ttl_s=5.0),
                    verifier=TokenVerifier(
                        [pair.public_pem], issuer="toolfleet", audience="toolfleet-bench"
                    ),
                    policies=provider,
                    schemas=_schemas(),
                    approvals=RedisApprovalStore(redis, prefix=prefix),
                    # As the worker claims ids: in Redis, with a TTL (the in-memory twin
                    # keeps every id, which a soak of this bench counted as growth).
                    claims=RedisInvocationClaims(redis, prefix=prefix),
                    cancels=RedisCancelFlags(redis),
                    limiter=limiter,
                    idempotency=idempotency,
                    revocations=revocations,
                    grants=GrantSigner(b"g" * 32),
                )
                bench = Bench(service, tokens, scenario=scenario, tenants=args.tenants)
                await bench.round(min(args.n, 500), args.concurrency)  # warm-up
                rounds = [await bench.round(args.n, args.concurrency) for _ in range(args.rounds)]
                best = min(rounds, key=lambda r: r.requested.cpu_us + r.result.cpu_us)
                report[scenario] = {
                    "requested": vars(best.requested),
                    "result": vars(best.result),
                    "emitted": best.emitted,
                    "cpu_us_per_invocation": best.requested.cpu_us + best.result.cpu_us,
                    "rounds_cpu_us": [
                        round(r.requested.cpu_us + r.result.cpu_us, 1) for r in rounds
                    ],
                }
                stop.set()
                await asyncio.gather(*listeners)
                stop = asyncio.Event()
        finally:
            stop.set()
            await redis.aclose()
            await pool.close()
    return report


def _admission(limiter: RedisRateLimiter, idempotency: RedisIdempotencyStore) -> dict[str, Any]:
    """``admission=`` as the handler passes it; nothing for a release without it (to
    measure the code before it with ``PYTHONPATH=<old checkout>/services``)."""
    try:
        from toolfleet.policy.redis_stores import RedisAdmission
    except ImportError:
        return {}
    return {"admission": RedisAdmission(limiter, idempotency)}


def _schemas() -> CompiledSchemas:
    """The schemas policy's handler checks with (``CompiledSchemas`` before them)."""
    try:
        from toolfleet.policy.schemas import ManifestSchemas
    except ImportError:
        return CompiledSchemas()
    return ManifestSchemas()


def print_report(report: dict[str, Any]) -> None:
    print(
        f"policy_call_bench: n={report['n']} tenants={report['tenants']} "
        f"concurrency={report['concurrency']}"
    )
    print(
        f"{'scenario':<9}{'phase':<11}{'CPU µs/req':>12}{'Redis cmds/req':>16}{'round trips':>13}"
    )
    for scenario in SCENARIOS:
        if scenario not in report:
            continue
        for phase in ("requested", "result"):
            p = report[scenario][phase]
            print(
                f"{scenario:<9}{phase:<11}{p['cpu_us']:>12.1f}{p['commands']:>16.2f}"
                f"{p['round_trips']:>13.2f}"
            )
        total = report[scenario]["cpu_us_per_invocation"]
        rounds = report[scenario]["rounds_cpu_us"]
        print(f"{scenario:<9}{'total':<11}{total:>12.1f}   rounds: {rounds}")
        print(f"{'':<9}emitted: {report[scenario]['emitted']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4000, help="requests per round (default 4000)")
    parser.add_argument("--tenants", type=int, default=50, help="tenants (default 50)")
    parser.add_argument("--concurrency", type=int, default=200, help="in flight (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    parser.add_argument("--scenario", choices=[*SCENARIOS, "both"], default="both")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    if args.n < 1 or args.tenants < 1 or args.concurrency < 1 or args.rounds < 1:
        parser.error("--n, --tenants, --concurrency and --rounds must be positive")
    report = asyncio.run(run(args))
    print_report(report)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
