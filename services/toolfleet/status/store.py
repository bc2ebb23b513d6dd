"""Postgres adapter of the :class:`~toolfleet.status.service.Projection` port.

One transaction per event: a per-invocation advisory lock (the consumer handles many
records of a partition at once, and one invocation's events arrive on six topics),
then the ``projected_events`` insert — a conflict means the event was projected
before and nothing else happens — then read, transform (pure) and upsert the row.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

import asyncpg

from toolfleet.events.models import InvocationStatus
from toolfleet.status.projection import Checkpoint, InvocationRow
from toolfleet.status.service import ProjectInput

#: Advisory-lock class of invocation rows (two-int form; the key is hashtext(id)).
_LOCK_CLASS: Final = 7_143_022

_COLUMNS: Final = (
    "invocation_id",
    "tenant_id",
    "agent_did",
    "user_did",
    "session_id",
    "tool_id",
    "requested_version",
    "tool_version",
    "status",
    "status_rank",
    "current_phase",
    "progress_percent",
    "parameters",
    "result",
    "error",
    "warnings",
    "latest_checkpoint",
    "execution_metadata",
    "idempotency_key",
    "priority",
    "trace_id",
    "created_at",
    "started_at",
    "completed_at",
)

# Lock, then mark, in one round trip: the lock is taken while the FROM row is made,
# before the insert checks for a conflict.
_LOCK_AND_MARK = """
    INSERT INTO projected_events (source, event_id, invocation_id)
    SELECT $1::text, $2::text, $3::uuid
    FROM (SELECT pg_advisory_xact_lock($4, hashtext($5))) AS locked
    ON CONFLICT (source, event_id) DO NOTHING
    RETURNING 1
"""
# Both statements are built from the constant column list above, never from input.
_COLUMN_LIST = ", ".join(_COLUMNS)
_PLACEHOLDERS = ", ".join(f"${i}" for i in range(1, len(_COLUMNS) + 1))
_ASSIGNMENTS = ", ".join(f"{c} = EXCLUDED.{c}" for c in _COLUMNS[1:])
_SELECT = f"SELECT {_COLUMN_LIST} FROM tool_invocations WHERE invocation_id = $1"  # noqa: S608
_INSERT = f"INSERT INTO tool_invocations ({_COLUMN_LIST}, updated_at)"
_UPSERT = (
    f"{_INSERT} VALUES ({_PLACEHOLDERS}, now()) "
    f"ON CONFLICT (invocation_id) DO UPDATE SET {_ASSIGNMENTS}, updated_at = now()"
)


class PostgresProjection:
    """``tool_invocations`` + ``projected_events`` through an asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def project(self, call: ProjectInput) -> bool:
        invocation = uuid.UUID(call.invocation_id)
        async with self._pool.acquire() as conn, conn.transaction():
            marked = await conn.fetchval(
                _LOCK_AND_MARK,
                call.source,
                call.event_id,
                invocation,
                _LOCK_CLASS,
                call.invocation_id,
            )
            if marked is None:
                return False
            record = await conn.fetchrow(_SELECT, invocation)
            current = _row_of(record) if record is not None else None
            updated = call.transition(current)
            if updated is not None and updated != current:
                await conn.execute(_UPSERT, *_values(updated))
            return True

    async def get(self, invocation_id: str) -> InvocationRow | None:
        """The row of one invocation (tests, tools)."""
        async with self._pool.acquire() as conn:
            record = await conn.fetchrow(_SELECT, uuid.UUID(invocation_id))
        return _row_of(record) if record is not None else None


def _values(row: InvocationRow) -> list[Any]:
    return [
        uuid.UUID(row.invocation_id),
        row.tenant_id,
        row.agent_did,
        row.user_did,
        row.session_id,
        row.tool_id,
        row.requested_version,
        row.tool_version,
        str(row.status),
        row.status_rank,
        row.current_phase,
        row.progress_percent,
        row.parameters,
        row.result,
        row.error,
        list(row.warnings),
        row.latest_checkpoint.to_json() if row.latest_checkpoint else None,
        row.execution_metadata,
        row.idempotency_key,
        row.priority,
        row.trace_id,
        row.created_at,
        row.started_at,
        row.completed_at,
    ]


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
        result=record["result"],
        error=record["error"],
        warnings=tuple(record["warnings"] or ()),
        latest_checkpoint=Checkpoint.from_json(checkpoint) if checkpoint else None,
        execution_metadata=record["execution_metadata"],
        idempotency_key=record["idempotency_key"],
        priority=record["priority"],
        trace_id=record["trace_id"],
        created_at=record["created_at"],
        started_at=record["started_at"],
        completed_at=record["completed_at"],
    )
