"""Migration 0011 on a database that already holds calls: a row becomes a call,
``(tenant_id, invocation_id)``, and what was written before keeps its tenant."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from toolfleet.storage.postgres import create_pool, dsn_with_database, migrate, migration_files

pytestmark = pytest.mark.integration

TENANT_ROWS = "0011_tenant_scoped_rows.sql"
_ROW = (
    "INSERT INTO tool_invocations (invocation_id, tenant_id, tool_id, status, status_rank)"
    " VALUES ($1, $2, 'core__echo', 'pending', 0)"
)


@pytest.fixture
async def before_0011(postgres_admin_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A database migrated as a fleet was before migration 0011."""
    name = f"toolfleet_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres_admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    pool = await create_pool(dsn_with_database(postgres_admin_url, name))
    try:
        async with pool.acquire() as conn:
            await conn.execute(
                "CREATE TABLE schema_migrations (name text PRIMARY KEY, checksum text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for file, sql in migration_files():
                if file >= TENANT_ROWS:
                    break
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (name, checksum) VALUES ($1, $2)",
                    file,
                    hashlib.sha256(sql.encode()).hexdigest(),
                )
        yield pool
    finally:
        await pool.close()
        admin = await asyncpg.connect(postgres_admin_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


async def test_rows_become_calls_and_markers_keep_their_tenant(before_0011: asyncpg.Pool) -> None:
    pool = before_0011
    invocation_id = uuid.uuid4()
    await pool.execute(_ROW, invocation_id, "t_first")
    await pool.execute(
        "INSERT INTO projected_events (source, event_id, invocation_id, event_kind)"
        " VALUES ('/toolfleet/policy', 'e1', $1, 'authorized')",
        invocation_id,
    )
    with pytest.raises(asyncpg.UniqueViolationError):  # an id was one row
        await pool.execute(_ROW, invocation_id, "t_second")

    assert TENANT_ROWS in await migrate(pool)

    await pool.execute(_ROW, invocation_id, "t_second")  # now another tenant's call
    rows = await pool.fetch(
        "SELECT tenant_id FROM tool_invocations WHERE invocation_id = $1 ORDER BY tenant_id",
        invocation_id,
    )
    assert [r["tenant_id"] for r in rows] == ["t_first", "t_second"]
    with pytest.raises(asyncpg.UniqueViolationError):
        await pool.execute(_ROW, invocation_id, "t_first")
    marks = await pool.fetch("SELECT tenant_id, event_id FROM projected_events")
    assert [(r["tenant_id"], r["event_id"]) for r in marks] == [("t_first", "e1")]
    # The same source and event id of another tenant is another event.
    await pool.execute(
        "INSERT INTO projected_events (tenant_id, source, event_id, invocation_id)"
        " VALUES ('t_second', '/toolfleet/policy', 'e1', $1)",
        invocation_id,
    )
