"""Postgres adapter of the :class:`~toolfleet.status.service.Projection` port.

Events are projected in batches: every call made while the previous batch was being
written goes into the next one, a single transaction with a fixed number of
statements however many events it holds: per-invocation advisory locks (the consumer
handles many records at once, and one invocation's events arrive on six topics), taken
in a fixed order so that two batches never deadlock; the ``projected_events`` inserts,
where a conflict means the event was projected before and it changes nothing; one read
of the rows; the pure transitions, folded in the order the calls came; one upsert of
the rows that changed. An idle consumer's batch is a single event.

A row is a call, ``(tenant_id, invocation_id)`` (migration 0011): rows are read, folded
and written by the pair, and an event's dedupe marker is ``(tenant_id, source,
event_id)``. The advisory lock is taken on the id alone (as retention takes it): the
calls of two tenants under one id share it, which costs nothing and keeps it simple.

A batch that fails on a lost connection fails every call in it (the consumer runtime
waits that out and calls again). Any other failure is projected again one event per
transaction, so a poison event fails alone.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

import asyncpg

from toolfleet.coalescing import Coalescer
from toolfleet.events.identity import canonical_uuid
from toolfleet.events.models import InvocationStatus
from toolfleet.status.projection import InvocationRow, LatestCheckpoint
from toolfleet.status.service import ProjectInput
from toolfleet.storage.errors import POSTGRES_UNAVAILABLE

log = logging.getLogger(__name__)

#: Most events written in one transaction.
MAX_BATCH: Final = 256

#: Advisory-lock class of invocation rows (two-int form; the key is hashtext(id)).
_LOCK_CLASS: Final = 7_143_022

#: The row's columns in ``_values`` order, each with its Postgres type.
_TYPED_COLUMNS: Final = (
    ("invocation_id", "uuid"),
    ("tenant_id", "text"),
    ("agent_did", "text"),
    ("user_did", "text"),
    ("session_id", "text"),
    ("tool_id", "text"),
    ("requested_version", "text"),
    ("tool_version", "text"),
    ("status", "text"),
    ("status_rank", "int2"),
    ("current_phase", "text"),
    ("progress_percent", "float8"),
    ("parameters", "jsonb"),
    ("parameters_hash", "text"),
    ("result", "jsonb"),
    ("error", "jsonb"),
    ("warnings", "jsonb"),
    ("latest_checkpoint", "jsonb"),
    ("execution_metadata", "jsonb"),
    ("documents_accessed", "jsonb"),
    ("idempotency_key", "text"),
    ("priority", "text"),
    ("trace_id", "text"),
    ("created_at", "timestamptz"),
    ("started_at", "timestamptz"),
    ("completed_at", "timestamptz"),
)
_COLUMNS: Final = tuple(name for name, _ in _TYPED_COLUMNS)

# Both statements are built from the constant column list above, never from input.
_COLUMN_LIST = ", ".join(_COLUMNS)
#: What the first write fixes: an upsert fills them while unknown, never rewrites them
#: (the fold does the same; this holds even for a writer that got the fold wrong).
_FIRST_WRITE_WINS: Final = frozenset(
    {
        "agent_did",
        "user_did",
        "session_id",
        "requested_version",
        "tool_version",
        "parameters",
        "parameters_hash",
        "trace_id",
    }
)
_FIXED: Final = frozenset({"invocation_id", "tenant_id", "tool_id"})
_ASSIGNMENTS = ", ".join(
    f"{c} = COALESCE(tool_invocations.{c}, EXCLUDED.{c})"
    if c in _FIRST_WRITE_WINS
    else f"{c} = EXCLUDED.{c}"
    for c in _COLUMNS
    if c not in _FIXED
)
_SELECT = f"SELECT {_COLUMN_LIST} FROM tool_invocations WHERE tenant_id = $1 AND invocation_id = $2"  # noqa: S608
_SELECT_FIRST = (
    f"SELECT {_COLUMN_LIST} FROM tool_invocations WHERE invocation_id = $1"  # noqa: S608
    " ORDER BY created_at, tenant_id LIMIT 1"
)
# Every list a batch sends goes as one JSON parameter, read back by ``jsonb_to_recordset``
# or ``jsonb_array_elements_text``: written by orjson in one call (and escaped as the
# connection's JSON codec escapes, ``pg_text``), where a Postgres array costs asyncpg
# several abstract-class checks and a call of the text codec per element (the marks and
# rows as arrays were about a tenth of the status worker's CPU). A JSON null is SQL NULL
# in every column.
_SELECT_MANY = (
    f"SELECT {_COLUMN_LIST} FROM tool_invocations"  # noqa: S608
    " WHERE (tenant_id, invocation_id) IN (SELECT tenant_id, invocation_id"
    " FROM jsonb_to_recordset($1::jsonb) AS calls (tenant_id text, invocation_id uuid))"
)
# Sorted ids, locked in that order: batches that share invocations never deadlock.
_LOCK_MANY = """
    SELECT pg_advisory_xact_lock($1, hashtext(id))
    FROM (SELECT id FROM jsonb_array_elements_text($2::jsonb) AS id ORDER BY id) AS ordered
"""
_MARK_MANY = """
    INSERT INTO projected_events
        (tenant_id, source, event_id, invocation_id, event_kind, occurred_at, detail)
    SELECT tenant_id, source, event_id, invocation_id, event_kind, occurred_at, detail
    FROM jsonb_to_recordset($1::jsonb) AS marks (
        tenant_id text, source text, event_id text, invocation_id uuid, event_kind text,
        occurred_at timestamptz, detail jsonb
    )
    ON CONFLICT (tenant_id, source, event_id) DO NOTHING
    RETURNING tenant_id, source, event_id
"""
# The changed rows of a batch in one statement (a statement per row cost Postgres a
# quarter more).
_UPSERT_MANY = (
    f"INSERT INTO tool_invocations ({_COLUMN_LIST}, updated_at) "  # noqa: S608
    f"SELECT {_COLUMN_LIST}, now() FROM jsonb_to_recordset($1::jsonb) AS r ("
    + ", ".join(f"{name} {kind}" for name, kind in _TYPED_COLUMNS)
    + f") ON CONFLICT (tenant_id, invocation_id) DO UPDATE SET {_ASSIGNMENTS}, updated_at = now()"
)


class PostgresProjection:
    """``tool_invocations`` + ``projected_events`` through an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool, *, max_batch: int = MAX_BATCH) -> None:
        self._pool = pool
        self._max_batch = max_batch
        self._batches: Coalescer[ProjectInput, bool] = Coalescer(
            self._project_many, max_batch=max_batch
        )

    async def project(self, call: ProjectInput) -> bool:
        """Project ``call`` in the next batch; ``False`` if its event was projected before."""
        return await self._batches.submit(call)

    async def project_all(self, calls: Sequence[ProjectInput]) -> list[bool]:
        """Project ``calls`` in transactions of up to ``max_batch``, without waiting for
        the coalescer's next turn; raises the first call's error if one failed."""
        results: list[bool] = []
        for start in range(0, len(calls), self._max_batch):
            for result in await self._project_many(calls[start : start + self._max_batch]):
                if isinstance(result, Exception):
                    raise result
                results.append(result)
        return results

    async def _project_many(self, calls: Sequence[ProjectInput]) -> Sequence[bool | Exception]:
        try:
            return await self._project_batch(calls)
        except POSTGRES_UNAVAILABLE:
            raise
        except Exception as exc:
            if len(calls) == 1:
                raise
            # The type only: a driver's message may quote the rows.
            log.warning(
                "batch failed; projecting its events one by one",
                extra={"error": type(exc).__name__, "events": len(calls)},
            )
            return [await self._project_alone(call) for call in calls]

    async def _project_alone(self, call: ProjectInput) -> bool | Exception:
        try:
            (projected,) = await self._project_batch([call])
        except Exception as exc:
            return exc
        return projected

    async def _project_batch(self, calls: Sequence[ProjectInput]) -> list[bool]:
        # Canonical text, as the lock keys and the rows read back spell it (asyncpg sends
        # text to a uuid parameter as it sends a UUID); an id that is not a UUID fails here.
        ids = [canonical_uuid(call.invocation_id) for call in calls]
        keys = sorted(set(ids))
        # Each event's row, (tenant, id): read once per pair, folded in the calls' order.
        rows_of = [
            (call.tenant_id, invocation) for call, invocation in zip(calls, ids, strict=True)
        ]
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(_LOCK_MANY, _LOCK_CLASS, keys)
            marked = await conn.fetch(
                _MARK_MANY,
                [
                    {
                        "tenant_id": c.tenant_id,
                        "source": c.source,
                        "event_id": c.event_id,
                        "invocation_id": c.invocation_id,
                        "event_kind": c.kind,
                        "occurred_at": _time(c.occurred_at),
                        "detail": c.detail,
                    }
                    for c in calls
                ],
            )
            # Scalar text columns come back through the connection's codec: unescaped.
            fresh = {(r["tenant_id"], r["source"], r["event_id"]) for r in marked}
            stored = {
                (r["tenant_id"], str(r["invocation_id"])): _row_of(r)
                for r in await conn.fetch(
                    _SELECT_MANY,
                    [{"tenant_id": t, "invocation_id": i} for t, i in set(rows_of)],
                )
            }
            rows = dict(stored)
            results: list[bool] = []
            for call, key in zip(calls, rows_of, strict=True):
                event = (call.tenant_id, call.source, call.event_id)
                if event not in fresh:  # projected before, or a twin earlier in this batch
                    results.append(False)
                    continue
                fresh.discard(event)
                updated = call.transition(rows.get(key))
                if updated is not None:
                    rows[key] = updated
                results.append(True)
            changed = [_record(row) for key, row in rows.items() if row != stored.get(key)]
            if changed:
                await conn.execute(_UPSERT_MANY, changed)
        return results

    async def get(
        self, invocation_id: str, *, tenant_id: str | None = None
    ) -> InvocationRow | None:
        """The row of one call (tests, tools); without ``tenant_id``, the row of the
        id's first call (the earliest ``created_at``)."""
        async with self._pool.acquire() as conn:
            if tenant_id is None:
                record = await conn.fetchrow(_SELECT_FIRST, uuid.UUID(invocation_id))
            else:
                record = await conn.fetchrow(_SELECT, tenant_id, uuid.UUID(invocation_id))
        return _row_of(record) if record is not None else None


def _record(row: InvocationRow) -> dict[str, Any]:
    """The row as the upsert's JSON object (plain JSON: the codec's fallback for text
    orjson refuses is the standard library's, which writes no UUID or datetime)."""
    return {
        "invocation_id": row.invocation_id,
        "tenant_id": row.tenant_id,
        "agent_did": row.agent_did,
        "user_did": row.user_did,
        "session_id": row.session_id,
        "tool_id": row.tool_id,
        "requested_version": row.requested_version,
        "tool_version": row.tool_version,
        "status": str(row.status),
        "status_rank": row.status_rank,
        "current_phase": row.current_phase,
        "progress_percent": row.progress_percent,
        "parameters": row.parameters,
        "parameters_hash": row.parameters_hash,
        "result": row.result,
        "error": row.error,
        "warnings": list(row.warnings),
        "latest_checkpoint": row.latest_checkpoint.to_json() if row.latest_checkpoint else None,
        "execution_metadata": row.execution_metadata,
        "documents_accessed": list(row.documents_accessed),
        "idempotency_key": row.idempotency_key,
        "priority": row.priority,
        "trace_id": row.trace_id,
        "created_at": _time(row.created_at),
        "started_at": _time(row.started_at),
        "completed_at": _time(row.completed_at),
    }


def _time(moment: datetime | None) -> str | None:
    """RFC 3339 text of ``moment``; a naive one is UTC, as asyncpg takes it."""
    if moment is None:
        return None
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).isoformat()


def _row_of(record: asyncpg.Record) -> InvocationRow:
    checkpoint = record["latest_checkpoint"]
    return InvocationRow(
        invocation_id=str(record["invocation_id"]),
        tenant_id=record["tenant_id"],
        agent_did=record["agent_did"],
        user_did=record["user_did"],
        session_id=record["session_id"],
        tool_id=record["tool_id"],
        requested_version=record["requested_version"],
        tool_version=record["tool_version"],
        status=InvocationStatus(record["status"]),
        current_phase=record["current_phase"],
        progress_percent=float(record["progress_percent"]),
        parameters=record["parameters"],
        parameters_hash=record["parameters_hash"],
        result=record["result"],
        error=record["error"],
        warnings=tuple(record["warnings"] or ()),
        latest_checkpoint=LatestCheckpoint.from_json(checkpoint) if checkpoint else None,
        execution_metadata=record["execution_metadata"],
        documents_accessed=tuple(record["documents_accessed"] or ()),
        idempotency_key=record["idempotency_key"],
        priority=record["priority"],
        trace_id=record["trace_id"],
        created_at=record["created_at"],
        started_at=record["started_at"],
        completed_at=record["completed_at"],
    )
