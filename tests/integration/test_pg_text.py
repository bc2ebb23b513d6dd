"""Text Postgres refuses, through a real pool: stored, compared and read back as written."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from toolfleet.storage.pg_text import escape_array, unescape_array
from toolfleet.storage.postgres import create_pool

pytestmark = pytest.mark.integration

TRICKY = ["plain", "a\x00b", "\ud800", "x\udfffy", "\ue000", "\ue0000000", "\\u0000", ""]


@pytest.fixture
async def pool(database_url: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await create_pool(database_url, min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


async def test_text_json_and_arrays_round_trip(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "CREATE TEMP TABLE t (s text, j jsonb, plain json, a text[]) ON COMMIT DROP"
        )
        for text in TRICKY:
            document = {text: [text, {"k": text}], "n": 2**70}
            await conn.execute(
                "INSERT INTO t VALUES ($1, $2, $3, $4)",
                text,
                document,
                document,
                escape_array([text, None]),
            )
            row = await conn.fetchrow("SELECT * FROM t WHERE s = $1", text)
            assert row is not None
            assert row["s"] == text
            assert row["j"] == document
            assert row["plain"] == document
            assert unescape_array(row["a"]) == [text, None]
            # SQL sees the escaped form on both sides: equality, jsonb paths and unnest agree.
            assert await conn.fetchval("SELECT j->>'n' FROM t WHERE s = $1", text) == str(2**70)
            assert await conn.fetchval("SELECT j->$1->>0 FROM t WHERE s = $1", text) == text
            assert await conn.fetchval("SELECT $1 = ANY(a) FROM t WHERE s = $1", text)
            assert await conn.fetchval("SELECT unnest(a) FROM t WHERE s = $1 LIMIT 1", text) == text
            await conn.execute("DELETE FROM t")
