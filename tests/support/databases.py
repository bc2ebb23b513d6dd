"""Databases of a test's own on the shared Postgres server, dropped after."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import asyncpg

from toolfleet.storage.postgres import create_pool, dsn_with_database, migrate


@contextlib.asynccontextmanager
async def fresh_database(
    postgres_admin_url: str, *, before: str | None = None
) -> AsyncIterator[str]:
    """A new database, migrated (up to migration ``before``, excluded, for an upgrade
    test), dropped on exit; yields its URL."""
    name = f"toolfleet_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres_admin_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = dsn_with_database(postgres_admin_url, name)
    pool = await create_pool(url)
    try:
        await migrate(pool, before=before)
    finally:
        await pool.close()
    try:
        yield url
    finally:
        admin = await asyncpg.connect(postgres_admin_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@contextlib.asynccontextmanager
async def database_before(postgres_admin_url: str, migration: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on a database migrated as a fleet was before ``migration``."""
    async with fresh_database(postgres_admin_url, before=migration) as url:
        pool = await create_pool(url)
        try:
            yield pool
        finally:
            await pool.close()


async def advisory_lock_awaited(conn: asyncpg.Connection) -> bool:
    """Whether a session waits for an advisory lock (one ``conn`` holds, say)."""
    return bool(
        await conn.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        )
    )


async def alone_in_database(conn: asyncpg.Connection) -> bool:
    """Whether ``conn`` is the only session connected to its database."""
    others = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    return bool(others == 0)
