"""``toolfleet doctor`` against the real dev broker, Redis and Postgres: a healthy dev
deployment passes with warnings only; each gap production cannot live with fails the
command (exit 1) on its own line.

The deployment is this module's: its own database (tools registered, migrated), its own
Redis database with one executor of the ``default`` pool announced, the session's topics.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest
from typer.testing import CliRunner

from toolfleet.auth.grants import ensure_grant_key
from toolfleet.auth.keys import generate_key_pair
from toolfleet.bus.admin import kafka_topic_admin
from toolfleet.bus.topics import load_topic_specs
from toolfleet.cli.main import app
from toolfleet.executor.registration import register_catalog
from toolfleet.registry.catalog import discover
from toolfleet.settings import FleetSettings
from toolfleet.storage.pools import ExecutorPresence, RedisPoolPresence
from toolfleet.storage.postgres import create_pool
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration

#: An executor announced for the whole module (the real TTL is three heartbeats).
PRESENCE_TTL_S = 600.0


@dataclass(frozen=True, kw_only=True)
class Deployment:
    env: dict[str, str]
    """``TOOLFLEET_*`` of a healthy dev deployment."""
    database_url: str
    redis_url: str
    keys: Path


def _run(env: dict[str, str], *args: str) -> tuple[int, dict[str, str]]:
    """``toolfleet doctor``: exit code and its lines by check name."""
    done = CliRunner().invoke(app, ["doctor", "--timeout", "5", *args], env=env)
    lines = {line.split()[1]: line for line in done.stdout.splitlines()}
    return done.exit_code, lines


async def _run_off_loop(env: dict[str, str]) -> tuple[int, dict[str, str]]:
    """:func:`_run` from an async test (the command's ``asyncio.run`` needs a thread
    without a running loop)."""
    return await asyncio.to_thread(_run, env)


def _status(line: str) -> str:
    return line.split()[0]


@asynccontextmanager
async def _executor_of(redis_url: str, prefix: str, pools: tuple[str, ...]) -> AsyncIterator[None]:
    redis = connect_redis(redis_url)
    presence = RedisPoolPresence(redis, topic_prefix=prefix, ttl_s=PRESENCE_TTL_S)
    worker_id = f"doctor-test-{uuid.uuid4().hex[:8]}"
    try:
        await presence.announce(ExecutorPresence(worker_id=worker_id, pools=pools))
        yield
        await presence.withdraw(worker_id)
    finally:
        await redis.aclose()


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Keys as ``toolfleet dev`` writes them."""
    folder = tmp_path_factory.mktemp("doctor-keys")
    ensure_grant_key(folder / "grant.key")
    pair = generate_key_pair()
    (folder / "jwt_private.pem").write_bytes(pair.private_pem)
    (folder / "jwt_private.pem").chmod(0o600)
    (folder / "jwt_public.pem").write_bytes(pair.public_pem)
    return folder


@pytest.fixture(scope="module")
async def deployment(
    settings: FleetSettings, module_database_url: str, module_redis_url: str, keys: Path
) -> AsyncIterator[Deployment]:
    pool = await create_pool(module_database_url, min_size=1, max_size=1)
    try:
        await register_catalog(pool, discover())
    finally:
        await pool.close()
    env = {
        "TOOLFLEET_BROKER_PROFILE": "dev",
        "TOOLFLEET_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "TOOLFLEET_TOPIC_PREFIX": settings.topic_prefix,
        "TOOLFLEET_TOPIC_PARTITIONS": str(settings.topic_partitions),
        "TOOLFLEET_REDIS_URL": module_redis_url,
        "TOOLFLEET_DATABASE_URL": module_database_url,
        "TOOLFLEET_GRANT_KEY_FILE": str(keys / "grant.key"),
        "TOOLFLEET_JWT_PRIVATE_KEY_FILE": str(keys / "jwt_private.pem"),
        "TOOLFLEET_JWT_PUBLIC_KEY_FILE": str(keys / "jwt_public.pem"),
    }
    async with _executor_of(module_redis_url, settings.topic_prefix, ("default",)):
        yield Deployment(
            env=env, database_url=module_database_url, redis_url=module_redis_url, keys=keys
        )


def test_a_healthy_dev_deployment_passes_with_warnings_only(deployment: Deployment) -> None:
    code, lines = _run(deployment.env)
    assert code == 0, lines
    assert list(lines) == [
        "keys",
        "kafka-security",
        "broker-api",
        "topics",
        "retention",
        "replication",
        "redis",
        "migrations",
        "pools",
    ]
    assert {
        name: _status(line) for name, line in lines.items() if _status(line) != "ok"
    }.keys() <= {
        "kafka-security",  # plaintext on loopback
        "broker-api",  # the dev broker has no AlterConfigs
        "replication",  # one replica
        "redis",  # the test Redis may persist nothing
    }
    assert _status(lines["kafka-security"]) == "warn"
    assert _status(lines["replication"]) == "warn"
    assert lines["topics"].endswith("8 topics match topics.yaml, 4 partitions each")
    assert lines["pools"].endswith("default 1 executor")


def test_the_kafka_profile_fails_what_dev_only_warns(deployment: Deployment) -> None:
    code, lines = _run({**deployment.env, "TOOLFLEET_BROKER_PROFILE": "kafka"})
    assert code == 1
    assert _status(lines["replication"]) == "FAIL"
    assert "replication 1 < 3" in lines["replication"]
    assert _status(lines["kafka-security"]) == "warn"  # loopback: still only a warning


def test_plaintext_to_a_remote_broker_fails_under_the_kafka_profile(
    deployment: Deployment,
) -> None:
    remote = {
        **deployment.env,
        "TOOLFLEET_BROKER_PROFILE": "kafka",
        "TOOLFLEET_KAFKA_BOOTSTRAP": "192.0.2.1:9092",  # TEST-NET-1: nothing answers
    }
    done = CliRunner().invoke(app, ["doctor", "--timeout", "1"], env=remote)
    assert done.exit_code == 1
    lines = {line.split()[1]: line for line in done.stdout.splitlines()}
    assert lines["kafka-security"].startswith(
        "FAIL  kafka-security  PLAINTEXT to 192.0.2.1: no TLS"
    )
    assert lines["broker-api"].startswith("FAIL  broker-api      Kafka unreachable at 192.0.2.1")


def test_a_wrong_partition_count_fails(deployment: Deployment) -> None:
    code, lines = _run({**deployment.env, "TOOLFLEET_TOPIC_PARTITIONS": "5"})
    assert code == 1
    assert _status(lines["topics"]) == "FAIL"
    assert "4 partitions, want 5 (TOOLFLEET_TOPIC_PARTITIONS)" in lines["topics"]


def test_a_secret_key_file_others_can_read_fails(deployment: Deployment, tmp_path: Path) -> None:
    grant = tmp_path / "grant.key"
    grant.write_bytes((deployment.keys / "grant.key").read_bytes())
    grant.chmod(0o644)
    code, lines = _run({**deployment.env, "TOOLFLEET_GRANT_KEY_FILE": str(grant)})
    assert code == 1
    assert lines["keys"] == (
        f"FAIL  keys            grant key {grant}: mode 0644, want 0600 or 0400 (owner only)"
    )
    assert grant.read_text().strip() not in lines["keys"]


async def test_a_missing_topic_fails(deployment: Deployment, settings: FleetSettings) -> None:
    prefix = f"tfdoc{uuid.uuid4().hex[:6]}."
    partial = settings.model_copy(update={"topic_prefix": prefix})
    specs = load_topic_specs(partial)
    async with kafka_topic_admin(partial) as admin:
        await admin.create([spec for spec in specs if not spec.name.endswith(".dlq")])
    async with _executor_of(deployment.redis_url, prefix, ("default",)):
        code, lines = await _run_off_loop({**deployment.env, "TOOLFLEET_TOPIC_PREFIX": prefix})
    assert code == 1
    assert lines["topics"] == f"FAIL  topics          missing {prefix}dlq"
    assert {_status(line) for line in lines.values()} <= {"ok", "warn", "FAIL"}
    assert [n for n, line in lines.items() if _status(line) == "FAIL"] == ["topics"]


async def test_migrations_behind_fail(deployment: Deployment) -> None:
    conn = await asyncpg.connect(deployment.database_url)
    try:
        last = await conn.fetchrow(
            "DELETE FROM schema_migrations WHERE name = (SELECT max(name) FROM schema_migrations)"
            " RETURNING name, checksum"
        )
        assert last is not None
        try:
            code, lines = await _run_off_loop(deployment.env)
        finally:
            await conn.execute(
                "INSERT INTO schema_migrations (name, checksum) VALUES ($1, $2)",
                last["name"],
                last["checksum"],
            )
    finally:
        await conn.close()
    assert code == 1
    assert lines["migrations"].startswith(f"FAIL  migrations      1 behind: {last['name']}")


async def test_a_pool_without_an_executor_fails(deployment: Deployment) -> None:
    conn = await asyncpg.connect(deployment.database_url)
    try:
        await conn.execute("UPDATE tool_versions SET pool = 'gpu' WHERE tool_id = 'core__echo'")
        try:
            code, lines = await _run_off_loop(deployment.env)
        finally:
            await conn.execute(
                "UPDATE tool_versions SET pool = 'default' WHERE tool_id = 'core__echo'"
            )
    finally:
        await conn.close()
    assert code == 1
    assert lines["pools"].startswith("FAIL  pools           no live executor for pool gpu")
    assert lines["topics"].startswith("FAIL  topics          missing ")
    assert lines["topics"].endswith(".invoke.authorized.gpu")


def test_an_unreadable_topics_file_fails_the_topic_checks(
    deployment: Deployment, tmp_path: Path
) -> None:
    absent = tmp_path / "topics.yaml"
    code, lines = _run(deployment.env, "--topics-file", str(absent))
    assert code == 1
    for name in ("topics", "retention", "replication"):
        assert lines[name].endswith(f"cannot read topics from {absent}: FileNotFoundError")
