"""``bootstrap``: creates the database, migrates, creates topics, registers tools; twice is fine."""

from __future__ import annotations

import asyncio
import uuid

import asyncpg
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from tests.support.databases import advisory_lock_awaited, alone_in_database
from tests.support.eventually import eventually
from toolfleet.bus.admin import all_topics
from toolfleet.devstack.bootstrap import bootstrap, database_name, ensure_database
from toolfleet.settings import FleetSettings
from toolfleet.storage.postgres import MIGRATION_LOCK

pytestmark = pytest.mark.integration

BUILTIN_TOOLS = {"core__echo", "core__get_current_time", "core__long_running"}


async def _snapshot(database_url: str) -> tuple[list[str], list[tuple[str, str]]]:
    conn = await asyncpg.connect(database_url)
    try:
        migrations = [r["name"] for r in await conn.fetch("SELECT name FROM schema_migrations")]
        versions = [
            (r["tool_id"], r["version"])
            for r in await conn.fetch(
                "SELECT tool_id, version FROM tool_versions ORDER BY tool_id, version"
            )
        ]
        return migrations, versions
    finally:
        await conn.close()


async def _topics(bootstrap_servers: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def test_bootstrap_twice_creates_everything_once(
    settings: FleetSettings, unborn_database_url: str
) -> None:
    fleet = settings.model_copy(
        update={
            "database_url": unborn_database_url,
            "topic_prefix": f"boot{uuid.uuid4().hex[:6]}.",
        }
    )
    await bootstrap(fleet)
    first = await _snapshot(unborn_database_url)
    await bootstrap(fleet)  # idempotent: nothing new, nothing fails
    second = await _snapshot(unborn_database_url)

    assert first == second
    migrations, versions = second
    assert migrations, "no migration was applied"
    assert {tool_id for tool_id, _ in versions} >= BUILTIN_TOOLS
    assert await _topics(fleet.kafka_bootstrap) >= set(all_topics(fleet))


async def test_ensure_database_reports_whether_it_created(unborn_database_url: str) -> None:
    assert (database_name(unborn_database_url) or "").startswith("toolfleet_new_")
    assert await ensure_database(unborn_database_url) is True
    assert await ensure_database(unborn_database_url) is False


def test_database_name_reads_the_path_of_unix_socket_dsns() -> None:
    dsn = "postgresql://postgres:@/toolfleet?host=/tmp/x/pgdata"
    assert database_name(dsn) == "toolfleet"
    assert database_name("postgresql://postgres@127.0.0.1:5432") is None


async def test_a_bootstrap_stopped_mid_way_ends_at_once_and_leaves_no_connection(
    settings: FleetSettings, unborn_database_url: str
) -> None:
    """Ctrl-C while ``toolfleet dev`` prepares: the cancelled bootstrap must end (the
    process exits only once it has), and its connections with it, even while its
    migration waits on the lock another process holds."""
    fleet = settings.model_copy(update={"database_url": unborn_database_url})
    await ensure_database(unborn_database_url)
    holder = await asyncpg.connect(unborn_database_url)
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
        preparing = asyncio.create_task(bootstrap(fleet))

        await eventually(lambda: advisory_lock_awaited(holder), timeout=10)
        preparing.cancel()
        done, _ = await asyncio.wait([preparing], timeout=5)
        assert done, "the cancelled bootstrap did not end"
        assert preparing.cancelled()

        await eventually(lambda: alone_in_database(holder), timeout=5)
    finally:
        await holder.close()
