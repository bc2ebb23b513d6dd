"""``redis``, ``migrations`` and ``pools``: what Redis and Postgres say about the fleet.

Each check is a pure function of facts; the ``read_*`` adapters gather those facts
from a client (their callers bound them with a timeout).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from toolfleet.doctor.results import CheckResult, CheckStatus, Profile, production_only

REDIS = "redis"
MIGRATIONS = "migrations"
POOLS = "pools"


@dataclass(frozen=True, kw_only=True)
class RedisPersistence:
    """What Redis says about its persistence; ``None``: it would not say."""

    appendonly: bool | None
    """AOF on (``CONFIG GET appendonly``, else ``INFO persistence``'s ``aof_enabled``)."""
    save: str | None
    """RDB save points (``""``: none)."""
    appendfsync: str | None = None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def _config(redis: Redis, name: str) -> str | None:
    answer = await redis.config_get(name)
    for key, value in answer.items():
        if _text(key) == name:
            return _text(value)
    return None


async def read_persistence(redis: Redis) -> RedisPersistence:
    """``CONFIG GET``, or ``INFO persistence`` where a managed Redis refuses ``CONFIG``."""
    try:
        appendonly = await _config(redis, "appendonly")
        return RedisPersistence(
            appendonly=None if appendonly is None else appendonly == "yes",
            save=await _config(redis, "save"),
            appendfsync=await _config(redis, "appendfsync"),
        )
    except ResponseError:  # unknown command, renamed, or not permitted (NOPERM)
        pass
    try:
        info = await redis.info("persistence")
    except ResponseError:
        return RedisPersistence(appendonly=None, save=None)
    enabled = info.get("aof_enabled")
    return RedisPersistence(appendonly=None if enabled is None else bool(int(enabled)), save=None)


def check_persistence(facts: RedisPersistence, *, profile: Profile) -> CheckResult:
    """``redis``: AOF or RDB snapshots on (a restart must not lose checkpoints, approvals,
    dedupe markers and revocations); a warning when Redis does not say."""
    if facts.appendonly:
        fsync = f" (appendfsync {facts.appendfsync})" if facts.appendfsync else ""
        return CheckResult(name=REDIS, status=CheckStatus.OK, detail=f"appendonly yes{fsync}")
    if facts.save:
        return CheckResult(
            name=REDIS,
            status=CheckStatus.OK,
            detail=f"RDB snapshots (save {facts.save}), appendonly no: "
            "writes since the last snapshot are lost on a crash",
        )
    if facts.save is None:
        aof = "" if facts.appendonly is None else ", INFO shows appendonly off"
        return CheckResult(
            name=REDIS,
            status=CheckStatus.WARN,
            detail=f"persistence could not be checked (CONFIG refused{aof}); "
            "check the provider's persistence settings",
        )
    return CheckResult(
        name=REDIS,
        status=production_only(profile),
        detail="persistence off (appendonly no, no save points): a restart loses "
        "checkpoints, approvals, dedupe markers and revocations",
    )


async def read_migrations(pool: asyncpg.Pool) -> set[str] | None:
    """Names of the applied migrations; ``None`` when the database was never migrated."""
    async with pool.acquire() as conn:
        if not await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
            return None
        rows = await conn.fetch("SELECT name FROM schema_migrations")
    return {row["name"] for row in rows}


def check_migrations(applied: Collection[str] | None, shipped: Sequence[str]) -> CheckResult:
    """``migrations``: every migration this version ships is applied."""
    if applied is None:
        return CheckResult(
            name=MIGRATIONS,
            status=CheckStatus.FAIL,
            detail="the database was never migrated (`toolfleet init` migrates it)",
        )
    pending = [name for name in shipped if name not in applied]
    if pending:
        return CheckResult(
            name=MIGRATIONS,
            status=CheckStatus.FAIL,
            detail=f"{len(pending)} behind: {', '.join(pending)} (`toolfleet init` applies them)",
        )
    unknown = sorted(set(applied) - set(shipped))
    if unknown:
        return CheckResult(
            name=MIGRATIONS,
            status=CheckStatus.WARN,
            detail=f"applied migrations this version does not ship: {', '.join(unknown)} "
            "(a newer toolfleet migrated this database)",
        )
    latest = shipped[-1] if shipped else "none"
    return CheckResult(
        name=MIGRATIONS, status=CheckStatus.OK, detail=f"{len(shipped)} applied, latest {latest}"
    )


def check_pools(in_use: Collection[str], live: Mapping[str, int]) -> CheckResult:
    """``pools``: every pool a registered tool names has a live executor (otherwise its
    calls wait as ``queued`` until they time out)."""
    idle = sorted(pool for pool in in_use if live.get(pool, 0) <= 0)
    if idle:
        fix = " ".join(f"--pool {pool}" for pool in idle)
        return CheckResult(
            name=POOLS,
            status=CheckStatus.FAIL,
            detail=f"no live executor for pool {', '.join(idle)}: its calls wait as queued "
            f"until they time out (`toolfleet worker executor {fix}`)",
        )
    counts = ", ".join(
        f"{pool} {live[pool]} executor{'s' if live[pool] != 1 else ''}" for pool in sorted(in_use)
    )
    return CheckResult(name=POOLS, status=CheckStatus.OK, detail=counts or "no pools in use")
