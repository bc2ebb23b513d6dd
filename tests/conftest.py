"""Shared fixtures: one broker per session, a database per session, settings."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from hypothesis import settings as hypothesis_settings

from tests.support.databases import fresh_database
from tests.support.servers import (
    kafka_broker,
    postgres_server,
    redis_server,
)
from toolfleet.auth.grants import ensure_grant_key
from toolfleet.bus.admin import ensure_topics
from toolfleet.devstack.redis_claims import claimed_redis_database
from toolfleet.settings import FleetSettings
from toolfleet.storage.postgres import dsn_with_database

# Properties test what the code does, not how fast: on a loaded 2-core CI machine a
# single example can take longer than hypothesis's 200 ms default deadline.
hypothesis_settings.register_profile("toolfleet", deadline=None)
hypothesis_settings.load_profile("toolfleet")

# Nothing from a developer's .env or dev.env may leak into tests.
for _name in list(os.environ):
    if _name.startswith("TOOLFLEET_") and _name not in {
        "TOOLFLEET_REDIS_URL",
        "TOOLFLEET_DATABASE_URL",
        "TOOLFLEET_TEST_MODE",
        "TOOLFLEET_TEST_KAFKA_BOOTSTRAP",
    }:
        del os.environ[_name]
# pytest-xdist's workers start with COLUMNS=80 and LINES=24 in their environment. rich
# fixes a console's width when COLUMNS is set at its making (the CLI makes its consoles
# at import), so the CLI tests that run a command under a COLUMNS of their own would print
# at 80: without them, a console reads the terminal's size each time it prints.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
# The tests run on the embedded dev broker, hence its profile (``toolfleet dev`` sets it
# too): every FleetSettings built here, and every process started from here, reads it.
# A test of the ``kafka`` profile says so (``FleetSettings(broker_profile="kafka")``).
os.environ["TOOLFLEET_BROKER_PROFILE"] = "dev"


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    with kafka_broker() as bootstrap:
        yield bootstrap


@pytest.fixture(scope="session")
def redis_server_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url(redis_server_url: str) -> Iterator[str]:
    """A Redis database of this session's own, emptied: like the per-run Postgres
    database, nothing of an earlier or a concurrent run leaks in."""
    with claimed_redis_database(redis_server_url) as url:
        yield url


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    with postgres_server() as url:
        yield url


@pytest.fixture
def own_redis_url(redis_server_url: str) -> Iterator[str]:
    """Another Redis database, for a test that runs a fleet of its own: a fleet is one
    Postgres database and one Redis database, never a mix."""
    with claimed_redis_database(redis_server_url) as url:
        yield url


@pytest.fixture(scope="module")
def module_redis_url(redis_server_url: str) -> Iterator[str]:
    """A Redis database of this module's own, paired with :func:`module_database_url`."""
    with claimed_redis_database(redis_server_url) as url:
        yield url


@pytest.fixture(scope="session")
async def database_url(postgres_admin_url: str) -> AsyncIterator[str]:
    """A fresh, migrated database for this test session, dropped at the end."""
    async with fresh_database(postgres_admin_url) as url:
        yield url


@pytest.fixture(scope="module")
async def module_database_url(postgres_admin_url: str) -> AsyncIterator[str]:
    """A database of this module's own, for tests whose assertions cover a whole table
    (a catalog with no wildcard policy in it, say) and so must not see other modules' rows."""
    async with fresh_database(postgres_admin_url) as url:
        yield url


@pytest.fixture
async def unborn_database_url(postgres_admin_url: str) -> AsyncIterator[str]:
    """A database name nobody created yet (bootstrap must create it); dropped after."""
    name = f"toolfleet_new_{uuid.uuid4().hex[:10]}"
    yield dsn_with_database(postgres_admin_url, name)
    admin = await asyncpg.connect(postgres_admin_url)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(scope="session")
def fleet_grant_key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's grant key file: services that end calls sign their outcomes with
    it, and status (like every reader of outcomes) refuses to start without it."""
    path = tmp_path_factory.mktemp("grant") / "grant.key"
    ensure_grant_key(path)
    return path


@pytest.fixture(scope="session")
async def settings(
    kafka_bootstrap: str, redis_url: str, database_url: str, fleet_grant_key_file: Path
) -> FleetSettings:
    """Settings for this session: own topic prefix, 4 partitions, low latency."""
    fleet = FleetSettings(
        kafka_bootstrap=kafka_bootstrap,
        redis_url=redis_url,
        database_url=database_url,
        grant_key_file=fleet_grant_key_file,
        topic_prefix=f"tf{uuid.uuid4().hex[:8]}.",
        topic_partitions=4,
        drain_timeout_s=5,
        log_format="console",
    )
    await ensure_topics(fleet)
    return fleet
