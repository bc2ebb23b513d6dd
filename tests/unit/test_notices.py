"""Waiting for an outcome: woken by a notice, rechecking without one, giving up in time."""

from __future__ import annotations

import asyncio

import pytest

from toolfleet.storage.notices import MemoryFinishedNotices, await_finished

pytestmark = pytest.mark.unit


class Row:
    """An outcome that appears when ``finish`` is called; counts reads."""

    def __init__(self) -> None:
        self.value: str | None = None
        self.reads = 0

    async def read(self) -> str | None:
        self.reads += 1
        return self.value


async def test_a_notice_wakes_the_waiter_long_before_the_recheck() -> None:
    notices, row = MemoryFinishedNotices(), Row()
    with notices.watch("i1") as finished:
        waiter = asyncio.create_task(await_finished(row.read, finished, timeout_s=30, recheck_s=30))
        await asyncio.sleep(0)
        assert row.reads == 1
        row.value = "done"
        await notices.publish("i2")  # another invocation's notice wakes nobody here
        await asyncio.sleep(0)
        assert not waiter.done()
        await notices.publish("i1")
        assert await asyncio.wait_for(waiter, 1) == "done"
    assert row.reads == 2


async def test_an_outcome_stored_before_waiting_is_found_at_once() -> None:
    notices, row = MemoryFinishedNotices(), Row()
    row.value = "done"
    with notices.watch("i1") as finished:
        assert await await_finished(row.read, finished, timeout_s=0, recheck_s=1) == "done"


async def test_without_notices_the_recheck_finds_it() -> None:
    notices, row = MemoryFinishedNotices(), Row()
    with notices.watch("i1") as finished:
        waiter = asyncio.create_task(
            await_finished(row.read, finished, timeout_s=5, recheck_s=0.01)
        )
        await asyncio.sleep(0)
        row.value = "done"
        assert await asyncio.wait_for(waiter, 1) == "done"
    assert row.reads >= 2


async def test_gives_up_after_the_timeout() -> None:
    notices, row = MemoryFinishedNotices(), Row()
    with notices.watch("i1") as finished:
        assert await await_finished(row.read, finished, timeout_s=0.05, recheck_s=0.02) is None
    assert row.reads >= 2
