"""Migration 0011 on a database that already holds calls: a row becomes a call,
``(tenant_id, invocation_id)``, and what was written before keeps its tenant."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from tests.support.databases import database_before
from toolfleet.storage.postgres import migrate

pytestmark = pytest.mark.integration

TENANT_ROWS = "0011_tenant_scoped_rows.sql"
_ROW = (
    "INSERT INTO tool_invocations (invocation_id, tenant_id, tool_id, status, status_rank)"
    " VALUES ($1, $2, 'core__echo', 'pending', 0)"
)


@pytest.fixture
async def before_0011(postgres_admin_url: str) -> AsyncIterator[asyncpg.Pool]:
    """A database migrated as a fleet was before migration 0011."""
    async with database_before(postgres_admin_url, TENANT_ROWS) as pool:
        yield pool


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
