"""Result blobs in Postgres ``result_blobs``: results too large to travel in an event.

Two purposes share the table. A *transfer* blob carries the executor's raw result to the
validator when it would not fit an event; it expires after a day (the ``executed`` topic
holds the same data inline for smaller results, under the topic's own retention). An
*attachment* is the validated, redacted result an outcome links to when it only carries
a truncated preview; the status API serves it to the invocation's tenant.

Transfer blobs hold raw, unvalidated results, so with a fleet key configured they are
sealed at rest (AES-GCM, :mod:`toolfleet.storage.at_rest`), bound to their tenant,
invocation and blob id; a plaintext transfer blob written before the upgrade still
reads. Attachments are already validated and redacted, and are stored as they are.

Every read names the tenant: a blob of another tenant reads as missing. Expired rows are
deleted a few hundred at a time by later writes, so the table needs no janitor process.

Services depend on the :class:`ResultBlobs` port; :class:`PostgresBlobStore` implements
it, and :class:`MemoryBlobStore` is its twin for unit tests.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, Protocol

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from toolfleet.storage.at_rest import AtRestCipher, is_sealed

BlobPurpose = Literal["transfer", "attachment"]
_Conn = asyncpg.Connection | PoolConnectionProxy

#: One write in this many also deletes expired rows.
_PURGE_EVERY = 32
_PURGE_BATCH = 500
#: Purposes whose data is sealed when a cipher is configured.
_SEALED: frozenset[BlobPurpose] = frozenset({"transfer"})


@dataclass(frozen=True, slots=True)
class StoredBlob:
    blob_id: str
    content_type: str
    data: bytes


class ResultBlobs(Protocol):
    """Blobs of a tenant's invocation: the executor writes transfer blobs, the validator
    reads them back and writes attachments, the status API serves attachments."""

    async def put(
        self,
        data: bytes,
        *,
        tenant_id: str,
        invocation_id: str,
        purpose: BlobPurpose,
        content_type: str = ...,
        ttl_s: int | None = ...,
        blob_id: str | None = ...,
    ) -> str:
        """Store ``data`` and return its id; writing an existing ``blob_id`` again keeps
        the first copy."""
        ...

    async def get(
        self,
        blob_id: str,
        *,
        purpose: BlobPurpose,
        tenant_id: str | None,
        invocation_id: str | None = ...,
    ) -> StoredBlob | None:
        """The blob, if it exists with this ``purpose``, has not expired, and belongs to
        ``tenant_id`` (None: any tenant) and, when given, ``invocation_id``."""
        ...


class PostgresBlobStore:
    """Blobs of a tenant's invocation, with an optional expiry."""

    def __init__(self, pool: asyncpg.Pool, *, cipher: AtRestCipher | None = None) -> None:
        self._pool = pool
        self._cipher = cipher

    async def put(
        self,
        data: bytes,
        *,
        tenant_id: str,
        invocation_id: str,
        purpose: BlobPurpose,
        content_type: str = "application/json",
        ttl_s: int | None = None,
        blob_id: str | None = None,
    ) -> str:
        """Store ``data`` and return its id.

        ``blob_id`` makes the write idempotent: writing the same id again keeps the first
        copy (a redelivered event derives the same id and finds its blob stored).
        """
        key = _new_key(blob_id)
        expires = timedelta(seconds=ttl_s) if ttl_s else None
        size = len(data)
        data = _seal(self._cipher, data, purpose, tenant_id, invocation_id, str(key))
        async with self._pool.acquire() as conn:
            await conn.execute(
                """INSERT INTO result_blobs (blob_id, invocation_id, tenant_id, purpose,
                       content_type, size_bytes, data, expires_at)
                   VALUES ($1, $2, $3, $4, $5, $6, $7, now() + $8::interval)
                   ON CONFLICT (blob_id) DO NOTHING""",
                key,
                uuid.UUID(invocation_id),
                tenant_id,
                purpose,
                content_type,
                size,
                data,
                expires,
            )
            if random.randrange(_PURGE_EVERY) == 0:  # noqa: S311 - load spreading, not security
                await self.purge_expired(conn)
        return str(key)

    async def get(
        self,
        blob_id: str,
        *,
        purpose: BlobPurpose,
        tenant_id: str | None,
        invocation_id: str | None = None,
    ) -> StoredBlob | None:
        """The blob, if it exists with this ``purpose``, has not expired, and belongs to
        ``tenant_id`` (None: any tenant, for admins) and, when given, ``invocation_id``."""
        ids = _read_ids(blob_id, invocation_id)
        if ids is None:
            return None
        key, invocation = ids
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                """SELECT tenant_id, invocation_id, content_type, data FROM result_blobs
                   WHERE blob_id = $1 AND purpose = $4
                     AND ($2::text IS NULL OR tenant_id = $2)
                     AND ($3::uuid IS NULL OR invocation_id = $3)
                     AND (expires_at IS NULL OR expires_at > now())""",
                key,
                tenant_id,
                invocation,
                purpose,
            )
        if row is None:
            return None
        data = _open(
            self._cipher,
            bytes(row["data"]),
            purpose,
            row["tenant_id"],
            str(row["invocation_id"]),
            str(key),
        )
        if data is None:
            return None
        return StoredBlob(blob_id=str(key), content_type=row["content_type"], data=data)

    async def purge_expired(self, conn: _Conn | None = None) -> int:
        """Delete up to a batch of expired blobs; returns how many went."""
        sql = """DELETE FROM result_blobs WHERE blob_id IN (
                     SELECT blob_id FROM result_blobs
                     WHERE expires_at IS NOT NULL AND expires_at <= now() LIMIT $1)"""
        if conn is not None:
            status = await conn.execute(sql, _PURGE_BATCH)
        else:
            async with self._pool.acquire() as own:
                status = await own.execute(sql, _PURGE_BATCH)
        return int(status.split()[-1])


@dataclass(frozen=True, slots=True, kw_only=True)
class _Row:
    blob: StoredBlob
    tenant_id: str
    invocation_id: str
    purpose: BlobPurpose
    expires_at: float | None


class MemoryBlobStore:
    """:class:`PostgresBlobStore`'s twin: same reads, same idempotent writes, expiry on an
    injected clock (seconds)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        cipher: AtRestCipher | None = None,
    ) -> None:
        self._clock = clock
        self._cipher = cipher
        self._rows: dict[str, _Row] = {}
        self.outage: Exception | None = None
        """Set to make every call raise it, as a store that does not answer would."""

    def __len__(self) -> int:
        return len(self._rows)

    async def put(
        self,
        data: bytes,
        *,
        tenant_id: str,
        invocation_id: str,
        purpose: BlobPurpose,
        content_type: str = "application/json",
        ttl_s: int | None = None,
        blob_id: str | None = None,
    ) -> str:
        if self.outage is not None:
            raise self.outage
        key = str(_new_key(blob_id))
        if key not in self._rows:
            invocation = str(uuid.UUID(invocation_id))
            stored = _seal(self._cipher, bytes(data), purpose, tenant_id, invocation, key)
            self._rows[key] = _Row(
                blob=StoredBlob(blob_id=key, content_type=content_type, data=stored),
                tenant_id=tenant_id,
                invocation_id=invocation,
                purpose=purpose,
                expires_at=self._clock() + ttl_s if ttl_s else None,
            )
        return key

    async def get(
        self,
        blob_id: str,
        *,
        purpose: BlobPurpose,
        tenant_id: str | None,
        invocation_id: str | None = None,
    ) -> StoredBlob | None:
        if self.outage is not None:
            raise self.outage
        ids = _read_ids(blob_id, invocation_id)
        if ids is None:
            return None
        key, invocation = str(ids[0]), None if ids[1] is None else str(ids[1])
        row = self._rows.get(key)
        if (
            row is None
            or row.purpose != purpose
            or (tenant_id is not None and row.tenant_id != tenant_id)
            or (invocation is not None and row.invocation_id != invocation)
            or (row.expires_at is not None and row.expires_at <= self._clock())
        ):
            return None
        data = _open(self._cipher, row.blob.data, purpose, row.tenant_id, row.invocation_id, key)
        if data is None:
            return None
        return StoredBlob(blob_id=key, content_type=row.blob.content_type, data=data)

    def raw(self, blob_id: str) -> bytes:
        """The bytes as stored (sealed or not), as someone reading the table would see them."""
        return self._rows[str(uuid.UUID(blob_id))].blob.data


def _new_key(blob_id: str | None) -> uuid.UUID:
    """The id a write stores under: the caller's (idempotent writes) or a fresh one."""
    return uuid.UUID(blob_id) if blob_id is not None else uuid.uuid4()


def _read_ids(blob_id: str, invocation_id: str | None) -> tuple[uuid.UUID, uuid.UUID | None] | None:
    """A read's ids parsed; ``None`` when one is not a UUID (no such blob)."""
    try:
        return uuid.UUID(blob_id), uuid.UUID(invocation_id) if invocation_id is not None else None
    except ValueError:
        return None


def _aad(tenant_id: str, invocation_id: str, blob_id: str) -> bytes:
    return f"{tenant_id}\x1f{uuid.UUID(invocation_id)}\x1f{uuid.UUID(blob_id)}".encode()


def _seal(
    cipher: AtRestCipher | None,
    data: bytes,
    purpose: BlobPurpose,
    tenant_id: str,
    invocation_id: str,
    blob_id: str,
) -> bytes:
    if cipher is None or purpose not in _SEALED:
        return data
    return cipher.seal(data, aad=_aad(tenant_id, invocation_id, blob_id))


def _open(
    cipher: AtRestCipher | None,
    data: bytes,
    purpose: BlobPurpose,
    tenant_id: str,
    invocation_id: str,
    blob_id: str,
) -> bytes | None:
    """The stored bytes opened; plaintext from before the upgrade as it is; ``None`` for
    a sealed blob this process cannot open (no key, a rotated-out key, or tampering)."""
    if not is_sealed(data):
        return data
    if cipher is None:
        return None
    return cipher.open(data, aad=_aad(tenant_id, invocation_id, blob_id))
