"""The durable tier of checkpoints: Postgres ``tool_checkpoints``.

Each row's ``parent_checkpoint_id`` is the invocation's previous durable checkpoint. A
large state is stored as a delta against its parent (:mod:`~toolfleet.executor.
checkpoints.codec`), and every ``full_every``-th row of a chain is a full snapshot again,
so reading any checkpoint decodes at most ``full_every`` rows. Writes of one invocation
are serialised by a transaction-scoped advisory lock; a fenced write is refused
(:class:`~toolfleet.executor.leasing.fencing.StaleLease`) when a row of a newer lease epoch
exists, so a worker that lost its lease never appends after its successor.
"""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from toolfleet.coalescing import Coalescer
from toolfleet.errors import CheckpointFailed
from toolfleet.events.identity import CallKey
from toolfleet.executor.checkpoints.codec import decode, encode
from toolfleet.executor.checkpoints.store import Checkpoint
from toolfleet.executor.leasing.fencing import Fence, StaleLease
from toolfleet.storage.errors import POSTGRES_FAILURES

#: First key of the two-key advisory locks on an invocation's checkpoint rows.
_LOCK_CLASS = 7_143_022

#: The row and its ancestors up to the nearest full snapshot, oldest first.
_CHAIN_SQL = """
WITH RECURSIVE chain AS (
    SELECT checkpoint_id, invocation_id, tenant_id, checkpoint_type, name,
           parent_checkpoint_id, progress_percent, current_phase, state, encoding,
           created_at, 0 AS depth
    FROM tool_checkpoints WHERE checkpoint_id = $1
    UNION ALL
    SELECT c.checkpoint_id, c.invocation_id, c.tenant_id, c.checkpoint_type, c.name,
           c.parent_checkpoint_id, c.progress_percent, c.current_phase, c.state, c.encoding,
           c.created_at, chain.depth + 1
    FROM tool_checkpoints c JOIN chain ON c.checkpoint_id = chain.parent_checkpoint_id
    WHERE chain.encoding LIKE 'delta%' AND c.invocation_id = chain.invocation_id
      AND c.tenant_id = chain.tenant_id AND chain.depth < 1000
)
SELECT * FROM chain ORDER BY depth DESC
"""

#: The newest checkpoint id of each of a batch of calls (those that have one): a call
#: is its invocation and its tenant, so another tenant's rows of the id are not its own.
_NEWEST_SQL = """
SELECT DISTINCT ON (invocation_id, tenant_id) invocation_id, tenant_id, checkpoint_id
FROM tool_checkpoints WHERE invocation_id = ANY($1::uuid[])
ORDER BY invocation_id, tenant_id, created_at DESC, checkpoint_id DESC
"""

#: A connection of the pool (asyncpg hands out proxies of its connections).
_Conn = asyncpg.Connection | PoolConnectionProxy

#: Postgres unreachable, or refusing the row: either way the checkpoint was not stored.


@dataclass(frozen=True, slots=True)
class _Head:
    """The newest durable checkpoint of an invocation, decoded."""

    checkpoint_id: str
    state: dict[str, Any]
    deltas: int
    """Delta rows between it and its full snapshot (0: it is one)."""


class PostgresCheckpointStore:
    """Durable checkpoints in ``tool_checkpoints``, delta-encoded and compressed."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        delta_min_bytes: int = 4096,
        compress_min_bytes: int = 1024,
        full_every: int = 10,
        cache_size: int = 1024,
    ) -> None:
        self._pool = pool
        self._delta_min_bytes = delta_min_bytes
        self._compress_min_bytes = compress_min_bytes
        self._full_every = max(full_every, 1)
        self._cache_size = cache_size
        # The newest durable state this process wrote per invocation: saves the decode
        # of the parent's chain when the next delta is computed here too.
        self._heads: OrderedDict[CallKey, _Head] = OrderedDict()
        self._newest: Coalescer[tuple[uuid.UUID, str], str | None] = Coalescer(self._newest_of)

    async def save(self, checkpoint: Checkpoint, *, fence: Fence | None = None) -> None:
        """Insert a durable checkpoint as the child of the invocation's newest one.

        Raises:
            StaleLease: a row of a newer lease epoch exists; nothing was written.
            CheckpointFailed: Postgres could not be reached or refused the row.
        """
        invocation = _uuid(checkpoint.invocation_id)
        if invocation is None or checkpoint.tenant_id is None:
            raise CheckpointFailed("a durable checkpoint needs a uuid invocation id and a tenant")
        call = checkpoint.call
        # Serialised as the hot copy is: the state exactly as it will be read back.
        state: dict[str, Any] = json.loads(checkpoint.model_dump_json(include={"state"}))["state"]
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                    _LOCK_CLASS,
                    checkpoint.invocation_id,
                )
                # The call's own rows only: another tenant's rows of the same id neither
                # fence this call's writes nor head its chain.
                newest = await conn.fetchrow(
                    """SELECT checkpoint_id, tenant_id,
                              (SELECT max(lease_epoch) FROM tool_checkpoints
                               WHERE invocation_id = $1 AND tenant_id = $2) AS max_epoch
                       FROM tool_checkpoints WHERE invocation_id = $1 AND tenant_id = $2
                       ORDER BY created_at DESC, checkpoint_id DESC LIMIT 1""",
                    invocation,
                    checkpoint.tenant_id,
                )
                if fence is not None and newest is not None:
                    max_epoch = newest["max_epoch"]
                    if max_epoch is not None and max_epoch > fence.epoch:
                        raise StaleLease(fence)
                head = None
                if newest is not None:
                    head = await self._head(conn, call, newest["checkpoint_id"])
                # Every full_every-th row of a chain is a full snapshot: reads stay bounded.
                delta_base = None
                if head is not None and head.deltas + 1 < self._full_every:
                    delta_base = head
                encoded = encode(
                    state,
                    delta_base.state if delta_base is not None else None,
                    delta_min_bytes=self._delta_min_bytes,
                    compress_min_bytes=self._compress_min_bytes,
                )
                await conn.execute(
                    """INSERT INTO tool_checkpoints (checkpoint_id, invocation_id, tenant_id,
                           checkpoint_type, name, parent_checkpoint_id, progress_percent,
                           current_phase, state, encoding, size_bytes, lease_epoch, created_at)
                       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12,
                               clock_timestamp())""",
                    checkpoint.checkpoint_id,
                    invocation,
                    checkpoint.tenant_id,
                    checkpoint.checkpoint_type,
                    checkpoint.name,
                    head.checkpoint_id if head is not None else None,
                    checkpoint.progress_percent,
                    checkpoint.current_phase,
                    encoded.payload,
                    encoded.encoding,
                    len(encoded.payload),
                    fence.epoch if fence is not None else None,
                )
        except POSTGRES_FAILURES as exc:
            raise CheckpointFailed(f"checkpoint could not be saved: {type(exc).__name__}") from None
        except ValueError:  # the parent's chain does not decode
            raise CheckpointFailed("checkpoint could not be saved: corrupt parent") from None
        deltas = 0
        if delta_base is not None and encoded.encoding.startswith("delta"):
            deltas = delta_base.deltas + 1
        self._remember(call, _Head(checkpoint.checkpoint_id, state, deltas))

    async def latest(self, call: CallKey) -> Checkpoint | None:
        """The call's newest durable checkpoint, decoded (None: it has none).

        Almost every call asks about an invocation that never checkpointed (its first
        run): the runs that start together share one query for the newest ids, and only
        an invocation that has one costs a second round trip to decode its chain.
        """
        invocation = _uuid(call.invocation_id)
        if invocation is None:
            return None
        newest = await self._newest.submit((invocation, call.tenant_id))
        if newest is None:
            return None
        async with self._pool.acquire() as conn:
            return await self._read(conn, newest)

    async def _newest_of(self, calls: Sequence[tuple[uuid.UUID, str]]) -> list[str | None]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(_NEWEST_SQL, list({invocation for invocation, _ in calls}))
        found: dict[tuple[uuid.UUID, str], str] = {
            (row["invocation_id"], row["tenant_id"]): row["checkpoint_id"] for row in rows
        }
        return [found.get(call) for call in calls]

    async def get(self, checkpoint_id: str) -> Checkpoint | None:
        """A durable checkpoint by id, decoded (None: no such checkpoint)."""
        async with self._pool.acquire() as conn:
            return await self._read(conn, checkpoint_id)

    async def _read(self, conn: _Conn, checkpoint_id: str) -> Checkpoint | None:
        rows = await conn.fetch(_CHAIN_SQL, checkpoint_id)
        if not rows:
            return None
        state = _decode_chain(rows)
        row = rows[-1]
        return Checkpoint(
            checkpoint_id=row["checkpoint_id"],
            invocation_id=str(row["invocation_id"]),
            tenant_id=row["tenant_id"],
            checkpoint_type=row["checkpoint_type"],
            name=row["name"],
            state=state,
            progress_percent=row["progress_percent"],
            current_phase=row["current_phase"],
            timestamp=row["created_at"],
        )

    async def _head(self, conn: _Conn, call: CallKey, checkpoint_id: str) -> _Head | None:
        cached = self._heads.get(call)
        if cached is not None and cached.checkpoint_id == checkpoint_id:
            return cached
        rows = await conn.fetch(_CHAIN_SQL, checkpoint_id)
        if not rows:
            return None
        return _Head(checkpoint_id, _decode_chain(rows), deltas=len(rows) - 1)

    def _remember(self, call: CallKey, head: _Head) -> None:
        self._heads[call] = head
        self._heads.move_to_end(call)
        while len(self._heads) > self._cache_size:
            self._heads.popitem(last=False)


def _decode_chain(rows: list[asyncpg.Record]) -> dict[str, Any]:
    """Apply a chain read by ``_CHAIN_SQL`` (oldest first) from its full snapshot on."""
    if rows[0]["encoding"].startswith("delta"):
        raise CheckpointFailed(f"checkpoint {rows[-1]['checkpoint_id']} lost its chain")
    state: dict[str, Any] | None = None
    for row in rows:
        state = decode(bytes(row["state"]), row["encoding"], state)
    assert state is not None
    return state


def _uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None
