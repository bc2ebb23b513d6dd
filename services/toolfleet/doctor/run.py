"""Run every check of ``toolfleet doctor`` against one deployment.

The broker, Redis and Postgres are each reached once, in parallel, and every check is
bounded by the same timeout, so an unreachable service costs one timeout and shows as
a failure with its reason, never a hang. Output never holds a password, key or token:
endpoints are shown as ``host:port``, and errors by their kind (the messages of
toolfleet's own errors, which name files and settings, never their contents).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import asyncpg
from redis.asyncio import Redis

from toolfleet.bus.topics import TopicAdminError, TopicsFileError
from toolfleet.doctor.kafka import API, KafkaInspector, check_api_versions, check_security
from toolfleet.doctor.keys import check_keys
from toolfleet.doctor.results import CheckResult, CheckStatus, Profile, worst
from toolfleet.doctor.stores import (
    MIGRATIONS,
    POOLS,
    REDIS,
    check_migrations,
    check_persistence,
    check_pools,
    read_migrations,
    read_persistence,
)
from toolfleet.doctor.topics import (
    REPLICATION,
    RETENTION,
    TOPICS,
    check_replication,
    check_retention,
    check_topics,
    fleet_specs,
    production_specs,
    read_topics,
)
from toolfleet.errors import ToolfleetError
from toolfleet.settings import FleetSettings
from toolfleet.storage.pools import live_executors, pools_in_use
from toolfleet.storage.postgres import create_pool, migration_files

DEFAULT_TIMEOUT_S = 5.0
"""How long one check (or reaching one service) may take."""

T = TypeVar("T")


@dataclass(frozen=True)
class Unreachable:
    """Why a service could not be reached (safe to print)."""

    reason: str


def _why(exc: BaseException, timeout_s: float) -> str:
    """An error as safe text: toolfleet's own messages, else only its kind."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g}s"
    if isinstance(exc, ToolfleetError):
        return exc.message
    if isinstance(exc, TopicAdminError | TopicsFileError):
        return str(exc)
    kind = type(exc).__name__
    cause: BaseException | None = exc
    for _ in range(8):  # a client's error often wraps the socket's
        if cause is None:
            break
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror if cause is exc else f"{kind}: {cause.strerror}"
        cause = cause.__cause__ or cause.__context__
    return kind


def _endpoint(url: str) -> str:
    """``host:port/db`` of a URL, without user or password."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    host = parts.hostname or "localhost"
    port = f":{parts.port}" if parts.port else ""
    return f"{host}{port}{parts.path}"


async def _bounded(work: Awaitable[T], timeout_s: float) -> T | Unreachable:
    try:
        return await asyncio.wait_for(work, timeout_s)
    except Exception as exc:  # every failure is reported, as its kind; none escapes
        return Unreachable(_why(exc, timeout_s))


async def _open_redis(stack: AsyncExitStack, settings: FleetSettings, timeout_s: float) -> Redis:
    redis = Redis.from_url(
        settings.redis_url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
    )
    stack.push_async_callback(redis.aclose)
    await redis.ping()
    return redis


async def _open_postgres(stack: AsyncExitStack, settings: FleetSettings) -> asyncpg.Pool:
    pool = await create_pool(settings.database_url, min_size=1, max_size=2)
    stack.push_async_callback(pool.close)
    return pool


@dataclass(frozen=True, kw_only=True)
class _Reached:
    """The three services, each a client or why it could not be reached."""

    kafka: KafkaInspector | Unreachable
    redis: Redis | Unreachable
    postgres: asyncpg.Pool | Unreachable


async def _check(
    name: str,
    timeout_s: float,
    work: Callable[[], Awaitable[CheckResult]],
) -> CheckResult:
    found = await _bounded(work(), timeout_s)
    if isinstance(found, Unreachable):
        return CheckResult(name=name, status=CheckStatus.FAIL, detail=found.reason)
    return found


def _each_failed(names: Sequence[str], reason: str) -> list[CheckResult]:
    return [CheckResult(name=name, status=CheckStatus.FAIL, detail=reason) for name in names]


def _not_checked(name: str, service: str) -> CheckResult:
    return CheckResult(
        name=name, status=CheckStatus.FAIL, detail=f"not checked: {service} is unreachable"
    )


def _unreachable(name: str, service: str, where: str, why: Unreachable) -> CheckResult:
    return CheckResult(
        name=name,
        status=CheckStatus.FAIL,
        detail=f"{service} unreachable at {where}: {why.reason}",
    )


async def _broker_checks(
    reached: _Reached,
    settings: FleetSettings,
    *,
    profile: Profile,
    timeout_s: float,
    topics_file: Path | None,
) -> list[CheckResult]:
    kafka = reached.kafka
    if isinstance(kafka, Unreachable):
        return [
            _unreachable(API, "Kafka", settings.kafka_bootstrap, kafka),
            *(_not_checked(name, "Kafka") for name in _TOPIC_CHECKS),
        ]

    async def api() -> CheckResult:
        return check_api_versions(await kafka.api_versions(), settings=settings)

    api_result, topic_results = await asyncio.gather(
        _check(API, timeout_s, api),
        _topic_checks(
            kafka,
            reached.postgres,
            settings,
            profile=profile,
            timeout_s=timeout_s,
            topics_file=topics_file,
        ),
    )
    return [api_result, *topic_results]


_TOPIC_CHECKS = (TOPICS, RETENTION, REPLICATION)


async def _topic_checks(
    kafka: KafkaInspector,
    postgres: asyncpg.Pool | Unreachable,
    settings: FleetSettings,
    *,
    profile: Profile,
    timeout_s: float,
    topics_file: Path | None,
) -> list[CheckResult]:
    """``topics``, ``retention`` and ``replication`` from one description of the contract's
    topics and those of the pools in use (the contract's alone when Postgres is down)."""
    pools: set[str] | Unreachable = Unreachable("Postgres is unreachable")
    if not isinstance(postgres, Unreachable):
        pools = await _bounded(pools_in_use(postgres), timeout_s)
    in_use = set() if isinstance(pools, Unreachable) else pools
    try:
        specs = fleet_specs(settings, in_use, topics_file)
        production = production_specs(settings, in_use, topics_file)
    except TopicsFileError as exc:
        return _each_failed(_TOPIC_CHECKS, str(exc))
    facts = await _bounded(read_topics(kafka, specs), timeout_s)
    if isinstance(facts, Unreachable):
        return _each_failed(_TOPIC_CHECKS, facts.reason)
    topics = check_topics(specs, facts)
    if isinstance(pools, Unreachable):
        topics = CheckResult(
            name=TOPICS,
            status=worst([topics.status, CheckStatus.WARN]),
            detail=f"{topics.detail}; pool topics not checked ({pools.reason})",
        )
    return [
        topics,
        check_retention(specs, facts),
        check_replication(specs, production, facts, profile=profile),
    ]


async def _redis_check(
    reached: _Reached, settings: FleetSettings, *, profile: Profile, timeout_s: float
) -> CheckResult:
    redis = reached.redis
    if isinstance(redis, Unreachable):
        return _unreachable(REDIS, "Redis", _endpoint(settings.redis_url), redis)

    async def persistence() -> CheckResult:
        return check_persistence(await read_persistence(redis), profile=profile)

    return await _check(REDIS, timeout_s, persistence)


async def _migrations_check(
    reached: _Reached, settings: FleetSettings, *, timeout_s: float
) -> CheckResult:
    pg = reached.postgres
    if isinstance(pg, Unreachable):
        return _unreachable(MIGRATIONS, "Postgres", _endpoint(settings.database_url), pg)

    async def migrations() -> CheckResult:
        shipped = [name for name, _ in migration_files()]
        return check_migrations(await read_migrations(pg), shipped)

    return await _check(MIGRATIONS, timeout_s, migrations)


async def _pools_check(
    reached: _Reached, settings: FleetSettings, *, timeout_s: float
) -> CheckResult:
    pg, redis = reached.postgres, reached.redis
    if isinstance(pg, Unreachable):
        return _not_checked(POOLS, "Postgres")
    if isinstance(redis, Unreachable):
        return _not_checked(POOLS, "Redis")

    async def pools() -> CheckResult:
        in_use, live = await asyncio.gather(
            pools_in_use(pg), live_executors(redis, topic_prefix=settings.topic_prefix)
        )
        return check_pools(in_use, live)

    return await _check(POOLS, timeout_s, pools)


async def examine(
    settings: FleetSettings,
    *,
    profile: Profile | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    topics_file: Path | None = None,
    uid: int | None = None,
) -> list[CheckResult]:
    """Every check, in a fixed order: keys, Kafka security, broker API, topics,
    retention, replication, Redis, migrations, pools.

    Args:
        profile: judge as this profile (default: the settings' ``broker_profile``).
        timeout_s: bound of each check and of reaching each service.
        topics_file: topic definitions instead of the packaged ``topics.yaml``.
        uid: who should own the secret files (default: this process's user).
    """
    chosen = profile or settings.broker_profile
    local = [check_keys(settings, uid=uid), check_security(settings, profile=chosen)]
    async with AsyncExitStack() as stack:
        kafka, redis, postgres = await asyncio.gather(
            _bounded(KafkaInspector.open(stack, settings, timeout_s=timeout_s), timeout_s),
            _bounded(_open_redis(stack, settings, timeout_s), timeout_s),
            _bounded(_open_postgres(stack, settings), timeout_s),
        )
        reached = _Reached(kafka=kafka, redis=redis, postgres=postgres)
        broker, redis_result, migrations, pools = await asyncio.gather(
            _broker_checks(
                reached, settings, profile=chosen, timeout_s=timeout_s, topics_file=topics_file
            ),
            _redis_check(reached, settings, profile=chosen, timeout_s=timeout_s),
            _migrations_check(reached, settings, timeout_s=timeout_s),
            _pools_check(reached, settings, timeout_s=timeout_s),
        )
    return [*local, *broker, redis_result, migrations, pools]


def failed(results: Sequence[CheckResult]) -> bool:
    """Whether any check failed (``toolfleet doctor`` exits 1)."""
    return any(result.status is CheckStatus.FAIL for result in results)


async def examine_and_say(
    settings: FleetSettings,
    say: Callable[[str], None],
    *,
    profile: Profile | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[CheckResult]:
    """:func:`examine`, each result said as its line (``toolfleet dev`` at start)."""
    results = await examine(settings, profile=profile, timeout_s=timeout_s)
    for result in results:
        say(result.line())
    return results
