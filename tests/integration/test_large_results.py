"""Results larger than an event may carry, through policy, executor and validator.

The client gets a preview in ``result``, ``execution_metadata.truncated`` and a blob
attachment holding the whole validated, redacted result; a result over the hard limit
ends as ``resource_exhausted``. Real broker, Redis and Postgres.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.events.large_results import encode_result
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.registry.redaction import REDACTED
from toolfleet.settings import FleetSettings
from toolfleet.storage.blobs import PostgresBlobStore
from toolfleet.storage.postgres import create_pool

pytestmark = pytest.mark.integration

INLINE = 4096
HARD_LIMIT = 256 * 1024
AGENT = "did:agent:test"


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("large-results")
    local = fleet_settings(
        settings, home, result_inline_bytes=INLINE, max_result_blob_bytes=HARD_LIMIT
    )
    async with in_process_fleet(local) as running:
        yield running


@pytest.fixture(scope="module")
async def blobs(fleet: Fleet) -> AsyncIterator[PostgresBlobStore]:
    pool = await create_pool(fleet.settings.database_url)
    try:
        yield PostgresBlobStore(pool)
    finally:
        await pool.close()


async def big(fleet: Fleet, rows: int, tenant: str = "t1") -> ToolOutcome:
    return await fleet.client.call(
        "test__big_output",
        {"rows": rows, "text_bytes": 100},
        tenant_id=tenant,
        agent_did=AGENT,
        capability_token=fleet.token(tenant),
        timeout=30,
    )


def redacted_rows(rows: int) -> dict[str, Any]:
    """What the client may see of ``test__big_output``: its secrets redacted."""
    return {
        "rows": [
            {"index": i, "text": f"{i:08d}".ljust(100, "x"), "secret": REDACTED}
            for i in range(rows)
        ],
        "total": rows,
    }


async def test_a_small_result_is_inline_and_whole(fleet: Fleet) -> None:
    outcome = await big(fleet, 3)
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result == redacted_rows(3)
    assert outcome.execution_metadata.truncated is False
    assert outcome.execution_metadata.attachments == []


async def test_a_large_result_arrives_as_preview_and_attachment(
    fleet: Fleet, blobs: PostgresBlobStore
) -> None:
    rows = 600  # about 80 KB: over the inline limit, so executor and validator use blobs
    outcome = await big(fleet, rows)
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    meta = outcome.execution_metadata
    assert meta.truncated is True
    whole = encode_result(redacted_rows(rows))
    [attachment] = meta.attachments
    assert attachment.kind == "blob"
    assert attachment.content_type == "application/json"
    assert attachment.bytes == len(whole)
    invocation_id = str(outcome.invocation_id)
    prefix = f"/v1/invocations/{invocation_id}/attachments/"
    assert attachment.url.startswith(prefix)

    # The preview: small, same shape, already redacted.
    assert outcome.result is not None
    assert len(encode_result(outcome.result)) <= INLINE
    assert outcome.result["total"] == rows
    assert 0 < len(outcome.result["rows"]) < rows
    assert outcome.result["rows"][0] == {
        "index": 0,
        "text": "00000000" + "x" * 92,
        "secret": REDACTED,
    }

    # The attachment: the whole redacted result, for this tenant only.
    blob_id = attachment.url.removeprefix(prefix)
    stored = await blobs.get(
        blob_id, purpose="attachment", tenant_id="t1", invocation_id=invocation_id
    )
    assert stored is not None
    assert json.loads(stored.data) == redacted_rows(rows)
    assert b"s3cr3t" not in stored.data
    assert await blobs.get(blob_id, purpose="attachment", tenant_id="t2") is None


async def test_a_result_over_the_hard_limit_is_resource_exhausted(fleet: Fleet) -> None:
    outcome = await big(fleet, 3000)  # about 400 KB
    assert outcome.status is InvocationStatus.ERROR
    assert outcome.error is not None
    assert outcome.error.code == "resource_exhausted"
    assert outcome.error.details["limit"] == HARD_LIMIT
    assert outcome.result is None


async def test_expired_blobs_are_purged(fleet: Fleet, blobs: PostgresBlobStore) -> None:
    invocation = "7c0e4bde-1f9c-4d0b-8a59-2f8e1f6b3a21"
    blob_id = await blobs.put(
        b"{}", tenant_id="t1", invocation_id=invocation, purpose="transfer", ttl_s=1
    )
    pool: asyncpg.Pool = blobs._pool
    await pool.execute(
        "UPDATE result_blobs SET expires_at = now() - interval '1 s' WHERE blob_id = $1::uuid",
        blob_id,
    )
    assert await blobs.get(blob_id, purpose="transfer", tenant_id="t1") is None
    assert await blobs.purge_expired() >= 1
    left = await pool.fetchval(
        "SELECT count(*) FROM result_blobs WHERE blob_id = $1::uuid", blob_id
    )
    assert left == 0
