"""Large results: the preview an outcome carries, and how the executor sends them on."""

from __future__ import annotations

import json
from typing import Any

import asyncpg.exceptions as pg
import pytest

from toolfleet.errors import ResourceExhausted
from toolfleet.events.large_results import ELLIPSIS, attachment_url, encode_result, preview
from toolfleet.executor.result_transfer import ResultTransfer
from toolfleet.settings import FleetSettings
from toolfleet.storage.blobs import BlobPurpose

ROWS = {
    "rows": [{"index": i, "text": "x" * 500} for i in range(1000)],
    "total": 1000,
    "title": "t" * 40_000,
}


@pytest.mark.parametrize("budget", [1024, 4096, 65_536])
def test_preview_fits_the_budget_and_keeps_the_shape(budget: int) -> None:
    cut = preview(ROWS, budget)
    assert len(encode_result(cut)) <= budget
    assert set(cut) == {"rows", "total", "title"}
    assert cut["total"] == 1000
    assert 1 <= len(cut["rows"]) < 1000
    assert cut["rows"][0]["index"] == 0
    assert cut["title"].endswith(ELLIPSIS)
    assert ROWS["title"].startswith(cut["title"][:-1])


def test_a_result_within_the_budget_is_its_own_preview() -> None:
    small = {"a": [1, 2, 3], "b": "text"}
    assert preview(small, 1024) == small


def test_a_result_nothing_of_which_fits_previews_as_empty() -> None:
    wide = {f"key_{i:04d}_{'k' * 200}": i for i in range(100)}
    assert preview(wide, 16) == {}


def test_encoding_is_compact_utf8() -> None:
    assert encode_result({"é": [1, 2]}) == '{"é":[1,2]}'.encode()


def test_attachment_url_is_under_the_invocation() -> None:
    assert attachment_url("inv", "blob") == "/v1/invocations/inv/attachments/blob"


def test_inline_limit_leaves_room_in_an_event() -> None:
    assert FleetSettings(max_event_bytes=65_536).result_inline_limit == 32_768
    assert FleetSettings(result_inline_bytes=4096).result_inline_limit == 4096


class _Blobs:
    """Blob store double: records writes, fails the first ``outages`` of them."""

    def __init__(self, outages: int = 0) -> None:
        self.outages = outages
        self.stored: list[tuple[bytes, str, BlobPurpose, int | None]] = []

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
        if self.outages:
            self.outages -= 1
            raise pg.CannotConnectNowError("the database system is starting up")
        self.stored.append((data, tenant_id, purpose, ttl_s))
        return f"blob-{len(self.stored)}"


def _packer(blobs: _Blobs | None) -> ResultTransfer:
    return ResultTransfer(blobs=blobs, inline_bytes=1024, max_bytes=100_000)


async def _pack(transfer: ResultTransfer, result: dict[str, Any]) -> Any:
    return await transfer.pack(
        result, encode_result(result), tenant_id="acme", invocation_id="inv-1"
    )


async def test_a_small_result_travels_inline() -> None:
    blobs = _Blobs()
    assert await _pack(_packer(blobs), {"ok": True}) == ({"ok": True}, None)
    assert blobs.stored == []


async def test_a_large_result_travels_as_a_transfer_blob() -> None:
    blobs = _Blobs(outages=2)  # a Postgres restart is waited out
    result = {"text": "y" * 5000}
    inline, ref = await _pack(_packer(blobs), result)
    assert inline == {}
    assert ref is not None
    assert ref.bytes == len(encode_result(result))
    data, tenant, purpose, ttl = blobs.stored[0]
    assert json.loads(data) == result
    assert (tenant, purpose) == ("acme", "transfer")
    assert ttl is not None


async def test_a_result_over_the_hard_limit_is_resource_exhausted() -> None:
    with pytest.raises(ResourceExhausted) as raised:
        await _pack(_packer(_Blobs()), {"text": "z" * 200_000})
    assert raised.value.details["limit"] == 100_000


async def test_without_a_blob_store_a_large_result_is_resource_exhausted() -> None:
    with pytest.raises(ResourceExhausted):
        await _pack(_packer(None), {"text": "z" * 5000})
