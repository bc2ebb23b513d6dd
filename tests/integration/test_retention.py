"""Retention against real Postgres: old rows go (archived first), the rest stays."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from tests.support.eventually import eventually
from toolfleet.settings import FleetSettings
from toolfleet.storage.postgres import create_pool
from toolfleet.storage.retention import JsonLinesArchive, RetentionJob, RetentionPolicy
from toolfleet.worker import load_build, open_resources

pytestmark = pytest.mark.integration

# Far enough ahead that every row other tests of this session wrote is young.
NOW = datetime.now(UTC).replace(microsecond=0)
_IDS_OF_TENANT = "SELECT invocation_id FROM tool_invocations WHERE tenant_id = $1"
_COUNT_TENANT = "SELECT count(*) FROM tool_invocations WHERE tenant_id = $1"


@pytest.fixture
async def pool(module_database_url: str) -> AsyncIterator[asyncpg.Pool]:
    # A database of this module's own: a prune counts every old row, whoever wrote it.
    pool = await create_pool(module_database_url)
    yield pool
    await pool.close()


async def _invocation(
    pool: asyncpg.Pool,
    tenant: str,
    *,
    status: str,
    age: timedelta,
    checkpoints: int = 0,
    blob: bool = False,
    invocation_id: uuid.UUID | None = None,
) -> uuid.UUID:
    """A row created ``age`` ago; a finished one finished then too."""
    invocation_id = invocation_id or uuid.uuid4()
    at = NOW - age
    finished = status in {"success", "error"}
    await pool.execute(
        "INSERT INTO tool_invocations (invocation_id, tenant_id, tool_id, status, status_rank, "
        "result, created_at, completed_at) VALUES ($1, $2, 'core__echo', $3, $4, $5, $6, $7)",
        invocation_id,
        tenant,
        status,
        3 if finished else 2,
        {"message": "kept in the archive"} if finished else None,
        at,
        at if finished else None,
    )
    for n in range(checkpoints):
        await pool.execute(
            "INSERT INTO tool_checkpoints (checkpoint_id, invocation_id, tenant_id, "
            "checkpoint_type, state, created_at) VALUES ($1, $2, $3, 'micro', $4, $5)",
            f"{invocation_id}-{n}",
            invocation_id,
            tenant,
            b"\x00state",
            at,
        )
    if blob:
        await pool.execute(
            "INSERT INTO result_blobs (blob_id, invocation_id, tenant_id, purpose, content_type, "
            "size_bytes, data) VALUES ($1, $2, $3, 'attachment', 'application/json', 2, $4)",
            uuid.uuid4(),
            invocation_id,
            tenant,
            b"{}",
        )
    return invocation_id


async def _dedupe_row(pool: asyncpg.Pool, age: timedelta) -> str:
    event_id = str(uuid.uuid4())
    await pool.execute(
        "INSERT INTO projected_events (tenant_id, source, event_id, projected_at)"
        " VALUES ('t1', $1, $2, $3)",
        "/test/retention",
        event_id,
        NOW - age,
    )
    return event_id


async def _count(pool: asyncpg.Pool, sql: str, *args: object) -> int:
    value = await pool.fetchval(sql, *args)
    assert isinstance(value, int)
    return value


async def test_rows_past_their_age_go_younger_and_running_ones_stay(
    pool: asyncpg.Pool, tmp_path: Path
) -> None:
    tenant = f"t_ret_{uuid.uuid4().hex[:8]}"
    ancient = [
        await _invocation(pool, tenant, status="success", age=timedelta(days=91), checkpoints=2)
        for _ in range(3)
    ]
    with_blob = await _invocation(
        pool, tenant, status="error", age=timedelta(days=120), checkpoints=1, blob=True
    )
    month_old = await _invocation(
        pool, tenant, status="success", age=timedelta(days=30), checkpoints=3
    )
    fresh = await _invocation(pool, tenant, status="success", age=timedelta(days=2), checkpoints=2)
    running = await _invocation(
        pool, tenant, status="running", age=timedelta(days=200), checkpoints=2
    )
    old_marks = [await _dedupe_row(pool, timedelta(days=8)) for _ in range(5)]
    young_mark = await _dedupe_row(pool, timedelta(days=1))
    # Another tenant's pin under the same invocation id is another call's: it stays.
    for owner, pinned in ((tenant, with_blob), (tenant, fresh), (f"{tenant}_other", with_blob)):
        await pool.execute(
            "INSERT INTO document_pins (tenant_id, invocation_id, document_id, version)"
            " VALUES ($1, $2, 'd', '1')",
            owner,
            str(pinned),
        )

    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    job = RetentionJob(
        pool=pool,
        policy=RetentionPolicy(batch_size=2),
        archive=JsonLinesArchive(directory=tmp_path),
        clock=lambda: NOW,
        pause=pause,
    )
    report = await job.prune()

    gone = [*ancient, with_blob]
    assert report.invocations == 4
    assert report.checkpoints == 2 * 3 + 1 + 3  # the ancient ones' and the month-old one's
    assert report.blobs == 1
    assert report.dedupe_rows >= 5
    assert pauses, "batches of 2 take several transactions, with a breath between them"

    remaining = {
        r["invocation_id"]
        for r in await pool.fetch(
            "SELECT invocation_id FROM tool_invocations WHERE tenant_id = $1", tenant
        )
    }
    assert remaining == {month_old, fresh, running}
    checkpoints = {
        r["invocation_id"]: r["n"]
        for r in await pool.fetch(
            "SELECT invocation_id, count(*) AS n FROM tool_checkpoints WHERE tenant_id = $1 "
            "GROUP BY invocation_id",
            tenant,
        )
    }
    assert checkpoints == {fresh: 2, running: 2}
    assert await _count(pool, "SELECT count(*) FROM result_blobs WHERE tenant_id = $1", tenant) == 0
    pins = await pool.fetch(
        "SELECT tenant_id, invocation_id FROM document_pins"
        " WHERE invocation_id = ANY($1::text[]) ORDER BY tenant_id",
        [str(with_blob), str(fresh)],
    )
    assert [(r["tenant_id"], r["invocation_id"]) for r in pins] == [
        (tenant, str(fresh)),  # a finished call's pins go
        (f"{tenant}_other", str(with_blob)),  # another tenant's call of that id keeps its own
    ]
    marks = {
        r["event_id"]
        for r in await pool.fetch(
            "SELECT event_id FROM projected_events WHERE source = '/test/retention'"
        )
    }
    assert young_mark in marks
    assert not marks & set(old_marks)

    day = NOW.date().isoformat()
    archived = [
        json.loads(line)
        for line in (tmp_path / "tool_invocations" / f"{day}.jsonl").read_text().splitlines()
    ]
    assert {a["invocation_id"] for a in archived} == {str(i) for i in gone}
    assert all(a["result"] == {"message": "kept in the archive"} for a in archived)
    assert all(a["tenant_id"] == tenant for a in archived)
    archived_checkpoints = [
        json.loads(line)
        for line in (tmp_path / "tool_checkpoints" / f"{day}.jsonl").read_text().splitlines()
    ]
    assert len(archived_checkpoints) == 10
    assert {a["state"] for a in archived_checkpoints} == {"AHN0YXRl"}  # base64 of b"\0state"

    again = await job.prune()
    assert (again.invocations, again.checkpoints) == (0, 0)


async def test_rows_someone_holds_are_skipped_not_waited_for(pool: asyncpg.Pool) -> None:
    tenant = f"t_ret_{uuid.uuid4().hex[:8]}"
    held = await _invocation(pool, tenant, status="success", age=timedelta(days=100))
    folded = await _invocation(pool, tenant, status="success", age=timedelta(days=100))
    free = await _invocation(pool, tenant, status="success", age=timedelta(days=100))
    async with pool.acquire() as other, other.transaction():
        # A writer holding the row, and the status projection folding another invocation.
        await other.execute(
            "SELECT 1 FROM tool_invocations WHERE invocation_id = $1 FOR UPDATE", held
        )
        await other.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))", 7_143_022, str(folded)
        )
        job = RetentionJob(pool=pool, clock=lambda: NOW)
        report = await asyncio.wait_for(job.prune(), timeout=10)
    assert report.invocations >= 1
    remaining = {
        r["invocation_id"]
        for r in await pool.fetch(
            "SELECT invocation_id FROM tool_invocations WHERE tenant_id = $1", tenant
        )
    }
    assert remaining == {held, folded}
    assert free not in remaining
    await job.prune()  # released now: they go on the next pass
    assert (
        await _count(pool, "SELECT count(*) FROM tool_invocations WHERE tenant_id = $1", tenant)
        == 0
    )


async def test_the_maintenance_worker_prunes_in_the_background(
    settings: FleetSettings, module_database_url: str, pool: asyncpg.Pool
) -> None:
    tenant = f"t_ret_{uuid.uuid4().hex[:8]}"
    await _invocation(pool, tenant, status="success", age=timedelta(days=365))
    own = settings.model_copy(update={"database_url": module_database_url})
    async with open_resources(own, service="maintenance") as res:
        consumers = await load_build("maintenance")(res)
        assert consumers == []
        assert res.jobs, "the maintenance worker runs its pruning as a background job"
        stop = asyncio.Event()
        tasks = [asyncio.create_task(job(stop)) for job in res.jobs]
        try:

            async def pruned() -> bool:
                return await _count(pool, _COUNT_TENANT, tenant) == 0

            await eventually(pruned, timeout=10)
        finally:
            stop.set()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)


async def test_a_finished_call_goes_without_another_tenants_call_of_the_same_id(
    pool: asyncpg.Pool,
) -> None:
    """A row is a call, (tenant, invocation id): pruning tenant A's finished call of an id
    leaves tenant B's running call of that id, and B's blobs, where they are."""
    finished, running = f"t_ret_{uuid.uuid4().hex[:8]}", f"t_ret_{uuid.uuid4().hex[:8]}"
    shared = await _invocation(pool, finished, status="success", age=timedelta(days=120), blob=True)
    await _invocation(
        pool,
        running,
        status="running",
        age=timedelta(days=200),
        checkpoints=1,
        blob=True,
        invocation_id=shared,
    )
    job = RetentionJob(pool=pool, clock=lambda: NOW, pause=lambda _: asyncio.sleep(0))
    await job.prune()

    assert await _count(pool, _COUNT_TENANT, finished) == 0
    assert [r["invocation_id"] for r in await pool.fetch(_IDS_OF_TENANT, running)] == [shared]
    blobs = "SELECT count(*) FROM result_blobs WHERE tenant_id = $1"
    assert (await _count(pool, blobs, finished), await _count(pool, blobs, running)) == (0, 1)
    checkpoints = "SELECT count(*) FROM tool_checkpoints WHERE tenant_id = $1"
    assert await _count(pool, checkpoints, running) == 1
