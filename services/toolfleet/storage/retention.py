"""Retention: prune (and optionally archive) Postgres rows past their age.

What goes, oldest first, in small batches:

* **checkpoints** (``tool_checkpoints``) of calls that finished more than
  ``checkpoints_after`` ago (default 7 days); running calls keep every checkpoint.
* **invocations** (``tool_invocations``) that finished more than ``invocations_after``
  ago (default 90 days), with their remaining checkpoints, result blobs and document
  pins (``document_pins``). A call that has not finished is never touched, however old.
* **dedupe rows** (``projected_events``) projected more than ``dedupe_after`` ago
  (``TOOLFLEET_DEDUPE_TTL_S``): a redelivery older than that is no longer recognised,
  as with the runtime's Redis markers.

Each batch is one short transaction: ``LIMIT`` plus ``FOR UPDATE SKIP LOCKED`` picks
rows nobody holds, and an invocation the status projection is folding right now is
skipped too (a *try* of the projection's per-invocation advisory lock), so pruning
never waits on the projection and never resurrects or races a row it writes. With an
:class:`Archive`, a batch's rows are written (and fsynced) before its transaction
commits: a row is deleted only once it is archived. A crash between the two archives
that batch again on the next run (at least once).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any, Final, Protocol
from uuid import UUID

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from toolfleet.storage.errors import POSTGRES_FAILURES

log = logging.getLogger(__name__)

#: The status projection's advisory-lock class of an invocation (``toolfleet.status.store``).
PROJECTION_LOCK_CLASS: Final = 7_143_022

Clock = Callable[[], datetime]
Pause = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, kw_only=True)
class RetentionPolicy:
    """How old rows may get, and how many go per transaction."""

    checkpoints_after: timedelta = timedelta(days=7)
    """Checkpoints of a finished call go this long after it finished."""
    invocations_after: timedelta = timedelta(days=90)
    """A finished invocation goes this long after it finished."""
    dedupe_after: timedelta = timedelta(days=7)
    """A dedupe row (``projected_events``) goes this long after it was written."""
    batch_size: int = 500
    """Rows per transaction."""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError("batch_size must be at least 1")

    def cutoffs(self, now: datetime) -> Cutoffs:
        """The instants before which each kind of row goes (pure)."""
        return Cutoffs(
            checkpoints=now - self.checkpoints_after,
            invocations=now - self.invocations_after,
            dedupe=now - self.dedupe_after,
        )


@dataclass(frozen=True, kw_only=True)
class Cutoffs:
    checkpoints: datetime
    invocations: datetime
    dedupe: datetime


@dataclass(frozen=True, kw_only=True)
class PruneReport:
    """Rows removed by one pass."""

    checkpoints: int = 0
    invocations: int = 0
    dedupe_rows: int = 0
    blobs: int = 0
    batches: int = 0

    def __add__(self, other: PruneReport) -> PruneReport:
        return PruneReport(
            checkpoints=self.checkpoints + other.checkpoints,
            invocations=self.invocations + other.invocations,
            dedupe_rows=self.dedupe_rows + other.dedupe_rows,
            blobs=self.blobs + other.blobs,
            batches=self.batches + other.batches,
        )


class Archive(Protocol):
    """Where rows go before they are deleted."""

    async def write(self, table: str, rows: Sequence[Mapping[str, Any]], *, day: date) -> None:
        """Store ``rows`` of ``table`` durably; return only once they are safe."""
        ...


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode()
    raise TypeError(f"cannot archive a {type(value).__name__}")


def json_line(row: Mapping[str, Any]) -> str:
    """One archived row: JSON, timestamps ISO 8601, ids as text, ``bytea`` as base64."""
    return json.dumps(dict(row), default=_json_default, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True, kw_only=True)
class JsonLinesArchive:
    """``{directory}/{table}/{YYYY-MM-DD}.jsonl``: one JSON object per row, appended.

    The day is the day of the pass that pruned the rows. Files are only appended to and
    fsynced before the delete commits.
    """

    directory: Path

    def path(self, table: str, day: date) -> Path:
        return self.directory / table / f"{day.isoformat()}.jsonl"

    async def write(self, table: str, rows: Sequence[Mapping[str, Any]], *, day: date) -> None:
        if rows:
            lines = "".join(f"{json_line(row)}\n" for row in rows)
            await asyncio.to_thread(self._append, self.path(table, day), lines)

    @staticmethod
    def _append(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())


# Every statement runs inside a batch's transaction.
_CHECKPOINTS_OF_FINISHED = """
WITH doomed AS MATERIALIZED (
    SELECT c.checkpoint_id FROM tool_checkpoints c
    JOIN tool_invocations i ON i.invocation_id = c.invocation_id AND i.tenant_id = c.tenant_id
    WHERE i.status_rank = 3 AND i.completed_at < $1
    LIMIT $2 FOR UPDATE OF c SKIP LOCKED
)
DELETE FROM tool_checkpoints c USING doomed
WHERE c.checkpoint_id = doomed.checkpoint_id
RETURNING c.*
"""
_FINISHED_INVOCATIONS = """
WITH candidates AS MATERIALIZED (
    SELECT tenant_id, invocation_id FROM tool_invocations
    WHERE status_rank = 3 AND completed_at < $1
    ORDER BY completed_at LIMIT $2 FOR UPDATE SKIP LOCKED
), doomed AS MATERIALIZED (
    SELECT tenant_id, invocation_id FROM candidates
    WHERE pg_try_advisory_xact_lock($3, hashtext(invocation_id::text))
)
DELETE FROM tool_invocations i USING doomed
WHERE i.tenant_id = doomed.tenant_id AND i.invocation_id = doomed.invocation_id
RETURNING i.*
"""
# A call is (tenant, invocation): the rows of the finished calls only.
_CHECKPOINTS_OF = """
DELETE FROM tool_checkpoints c USING unnest($1::uuid[], $2::text[]) AS d(invocation_id, tenant_id)
WHERE c.invocation_id = d.invocation_id AND c.tenant_id = d.tenant_id RETURNING c.*
"""
_BLOBS_OF = """
DELETE FROM result_blobs b USING unnest($1::uuid[], $2::text[]) AS d(invocation_id, tenant_id)
WHERE b.invocation_id = d.invocation_id AND b.tenant_id = d.tenant_id
"""
# A finished call resumes no more: its document version pins go with it.
_PINS_OF = """
DELETE FROM document_pins p USING unnest($1::text[], $2::text[]) AS d(invocation_id, tenant_id)
WHERE p.invocation_id = d.invocation_id AND p.tenant_id = d.tenant_id
"""
_DEDUPE_ROWS = """
DELETE FROM projected_events WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM projected_events WHERE projected_at < $1
    LIMIT $2 FOR UPDATE SKIP LOCKED
))
"""


_Conn = asyncpg.Connection | PoolConnectionProxy


def _count(status: str) -> int:
    return int(status.split()[-1])


@dataclass(kw_only=True)
class RetentionJob:
    """Prunes in batches; :meth:`prune` is one pass, :meth:`run` repeats it."""

    pool: asyncpg.Pool
    policy: RetentionPolicy = field(default_factory=RetentionPolicy)
    archive: Archive | None = None
    """Rows are archived here before they are deleted; ``None``: deleted only."""
    clock: Clock = lambda: datetime.now(UTC)
    pause: Pause = asyncio.sleep
    batch_pause_s: float = 0.05
    """Breath between batches, so a large backlog never hogs Postgres."""
    lock_timeout_ms: int = 2000
    """A batch that would wait longer for a lock gives up (and is tried next pass)."""

    async def prune(self) -> PruneReport:
        """One pass over every kind of row, batch after batch until none is due."""
        now = self.clock()
        cutoffs = self.policy.cutoffs(now)
        total = PruneReport()
        for step in (self._invocations, self._checkpoints, self._dedupe):
            while True:
                report = await step(cutoffs, now.date())
                total += report
                if report.batches == 0:
                    break
                await self.pause(self.batch_pause_s)
        return total

    async def run(self, stop: asyncio.Event, *, interval_s: float) -> None:
        """Prune every ``interval_s`` until ``stop``; a failed pass is logged and retried."""
        while not stop.is_set():
            try:
                report = await self.prune()
            except POSTGRES_FAILURES as exc:
                log.warning("retention pass failed", extra={"error": type(exc).__name__})
            else:
                log.info(
                    "retention pass done",
                    extra={
                        "checkpoints": report.checkpoints,
                        "invocations": report.invocations,
                        "dedupe_rows": report.dedupe_rows,
                        "blobs": report.blobs,
                    },
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=interval_s)

    async def _invocations(self, cutoffs: Cutoffs, day: date) -> PruneReport:
        limit = self.policy.batch_size
        async with self.pool.acquire() as conn, conn.transaction():
            await self._limits(conn)
            rows = await conn.fetch(
                _FINISHED_INVOCATIONS, cutoffs.invocations, limit, PROJECTION_LOCK_CLASS
            )
            if not rows:
                return PruneReport()
            ids = [r["invocation_id"] for r in rows]
            tenants = [r["tenant_id"] for r in rows]
            checkpoints = await conn.fetch(_CHECKPOINTS_OF, ids, tenants)
            blobs = _count(await conn.execute(_BLOBS_OF, ids, tenants))
            await conn.execute(_PINS_OF, [str(i) for i in ids], tenants)
            await self._archive("tool_checkpoints", checkpoints, day)
            await self._archive("tool_invocations", rows, day)
        return PruneReport(
            invocations=len(rows), checkpoints=len(checkpoints), blobs=blobs, batches=1
        )

    async def _checkpoints(self, cutoffs: Cutoffs, day: date) -> PruneReport:
        async with self.pool.acquire() as conn, conn.transaction():
            await self._limits(conn)
            rows = await conn.fetch(
                _CHECKPOINTS_OF_FINISHED, cutoffs.checkpoints, self.policy.batch_size
            )
            if not rows:
                return PruneReport()
            await self._archive("tool_checkpoints", rows, day)
        return PruneReport(checkpoints=len(rows), batches=1)

    async def _dedupe(self, cutoffs: Cutoffs, day: date) -> PruneReport:
        async with self.pool.acquire() as conn, conn.transaction():
            await self._limits(conn)
            deleted = _count(
                await conn.execute(_DEDUPE_ROWS, cutoffs.dedupe, self.policy.batch_size)
            )
        return PruneReport(dedupe_rows=deleted, batches=1 if deleted else 0)

    async def _limits(self, conn: _Conn) -> None:
        # SET LOCAL: ends with the transaction, so the pooled connection stays clean.
        await conn.execute(f"SET LOCAL lock_timeout = {int(self.lock_timeout_ms)}")

    async def _archive(self, table: str, rows: Sequence[asyncpg.Record], day: date) -> None:
        if self.archive is not None and rows:
            await self.archive.write(table, [dict(r) for r in rows], day=day)
