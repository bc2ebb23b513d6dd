"""asyncpg pool with lossless text and JSON codecs, and the migration runner."""

from __future__ import annotations

import hashlib
import logging
from importlib import resources

import asyncpg

from toolfleet.storage import pg_text

log = logging.getLogger(__name__)

#: Any number; all migrating processes take this advisory lock so only one applies.
MIGRATION_LOCK = 7_143_021


class PooledConnection(asyncpg.Connection):
    """A pool connection released without asyncpg's reset round trip.

    On every release asyncpg rolls back an open transaction (it still does) and then runs
    a reset query (``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL``): one
    more round trip per use, the biggest single cost of the status projection. toolfleet
    leaves no session state behind to reset: its advisory locks are all
    transaction-scoped, and it never LISTENs, SETs or holds a cursor past a transaction.
    Code that starts to must take its own connection, not a pooled one.
    """

    def get_reset_query(self) -> str:
        return ""


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    pool: asyncpg.Pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=pg_text.install,
        connection_class=PooledConnection,
    )
    return pool


def migration_files() -> list[tuple[str, str]]:
    """``(name, sql)`` of every migration, in order."""
    folder = resources.files("toolfleet.storage") / "migrations"
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return [(f.name, f.read_text()) for f in files]


async def migrate(pool: asyncpg.Pool, *, before: str | None = None) -> list[str]:
    """Apply pending migrations under an advisory lock; return the names applied.
    ``before``: stop at that migration (a database as a fleet had it then: upgrade tests)."""
    applied: list[str] = []
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   name text PRIMARY KEY, checksum text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = {
            r["name"]: r["checksum"] for r in await conn.fetch("SELECT * FROM schema_migrations")
        }
        for name, sql in migration_files():
            if before is not None and name >= before:
                break
            checksum = hashlib.sha256(sql.encode()).hexdigest()
            if name in done:
                if done[name] != checksum:
                    log.warning("applied migration changed since", extra={"migration": name})
                continue
            await conn.execute(sql)
            await conn.execute(
                "INSERT INTO schema_migrations (name, checksum) VALUES ($1, $2)", name, checksum
            )
            applied.append(name)
    if applied:
        log.info("applied migrations", extra={"migrations": applied})
    return applied


def dsn_with_database(dsn: str, database: str) -> str:
    """The same server, another database (tests create and drop their own)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))
