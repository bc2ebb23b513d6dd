"""The SSE stream of one invocation, from a scripted sequence of projection reads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest

from toolfleet.api.appearing import (
    APPEAR_FALLBACK_S,
    APPEAR_WAIT_S,
    AppearWait,
    appeared,
    first_view,
)
from toolfleet.api.feed import InvocationFeed
from toolfleet.api.routes.events import follow
from toolfleet.contract.http import InvocationView

pytestmark = pytest.mark.unit

ID = uuid.uuid4()
NOW = datetime(2026, 11, 24, tzinfo=UTC)


def _view(status: str, progress: float = 0, phase: str = "", **kw: Any) -> InvocationView:
    if progress and status not in {"success", "error"}:
        kw.setdefault("latest_checkpoint", {"checkpoint_id": f"cp-{progress}"})
    return InvocationView(
        invocation_id=ID,
        tenant_id="t1",
        tool_id="core__long_running",
        status=status,  # type: ignore[arg-type]
        progress_percent=progress,
        current_phase=phase,
        created_at=NOW,
        updated_at=NOW,
        **kw,
    )


async def _events(views: list[InvocationView]) -> list[tuple[str, dict[str, Any]]]:
    reads = iter(views[1:])
    pauses: list[float] = []

    async def read() -> InvocationView | None:
        return next(reads, None)

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    found = []
    async for frame in follow(read, views[0], pause=pause):
        lines = dict(line.split(": ", 1) for line in frame.strip().splitlines())
        found.append((lines["event"], json.loads(lines["data"])))
    assert len(pauses) == len(views) - 1  # one read per pause, nothing after the end
    return found


async def test_a_call_from_approval_to_its_result() -> None:
    events = await _events(
        [
            _view("pending_approval", phase="awaiting_approval"),
            _view("pending_approval", phase="awaiting_approval"),
            _view("running", phase="authorized"),
            _view("running", 50, "step 5"),
            _view("running", 50, "step 5"),
            _view("success", 100, "done", result={"steps": 10}),
        ]
    )
    assert [kind for kind, _ in events] == [
        "tool_call_start",
        "approval_pending",
        "progress",
        "tool_call_result",
    ]
    assert events[2][1]["progress_percent"] == 50
    assert events[3][1]["result"] == {"steps": 10}
    assert events[3][1]["status"] == "success"


async def test_a_finished_call_is_one_start_and_its_result() -> None:
    events = await _events([_view("error", error={"code": "timeout", "message": "slow"})])
    assert [kind for kind, _ in events] == ["tool_call_start", "tool_call_result"]
    assert events[1][1]["error"]["code"] == "timeout"


async def _first(reads: list[InvocationView | None]) -> tuple[InvocationView | None, int]:
    answers = iter(reads)
    pauses: list[float] = []
    now = [0.0]

    async def read() -> InvocationView | None:
        return next(answers, None)

    async def pause(seconds: float) -> None:
        # No notification comes: each pause lasts its whole fallback.
        pauses.append(seconds)
        now[0] += seconds

    view = await first_view(read, pause=pause, clock=lambda: now[0])
    assert sum(pauses) <= APPEAR_WAIT_S
    return view, len(pauses)


async def test_a_call_not_yet_in_the_projection_is_awaited_not_a_404() -> None:
    # Right after the 202 the status row may be missing for a few reads.
    view, pauses = await _first([None, None, _view("pending")])
    assert view is not None
    assert view.invocation_id == ID
    assert pauses == 2


async def test_a_missing_and_a_foreign_id_wait_the_same_then_404() -> None:
    # Another tenant's call reads as None exactly like a missing one: same wait, same end.
    missing, waited = await _first([])
    assert missing is None
    # The whole wait, in slow fallback reads (the feed wakes it sooner), not 25 polls.
    assert waited == round(APPEAR_WAIT_S / APPEAR_FALLBACK_S)


async def test_a_notice_of_the_call_wakes_its_waiters_and_no_other() -> None:
    reads: list[list[uuid.UUID]] = []

    async def read_many(ids: Sequence[uuid.UUID]) -> list[InvocationView]:
        reads.append(list(ids))
        return []

    feed = InvocationFeed(read_many=read_many, gather_s=0)
    others = [uuid.uuid4() for _ in range(1000)]
    with contextlib.ExitStack() as stack:
        mine = stack.enter_context(feed.awaiting(ID))
        twin = stack.enter_context(feed.awaiting(ID))  # a second read of the same call
        theirs = [stack.enter_context(feed.awaiting(other)) for other in others]
        assert feed.waiting == 1002

        feed.notice("not a uuid")  # a forged payload wakes nobody
        feed.notice(str(uuid.uuid4()))  # a call nobody awaits wakes nobody
        assert not mine.is_set()
        assert not any(changed.is_set() for changed in theirs)

        feed.notice(str(ID))  # this call (any tenant's of that id): its two waiters only
        assert mine.is_set()
        assert twin.is_set()
        assert not any(changed.is_set() for changed in theirs)
        await feed.deliver()
        assert reads == []  # no row read for waiters: each reads with its own scope

        mine.clear()
        feed.resync()  # notices may have been missed: every waiter reads again
        assert mine.is_set()
        assert all(changed.is_set() for changed in theirs)
    assert feed.waiting == 0  # every wait let go of its id


async def test_the_wait_reads_again_once_its_id_is_noticed() -> None:
    feed = InvocationFeed(read_many=lambda ids: _no_rows(), gather_s=0)
    answers = [None, _view("pending")]
    reads = 0
    first_read = asyncio.Event()

    async def read() -> InvocationView | None:
        nonlocal reads
        reads += 1
        first_read.set()
        return answers[min(reads, len(answers)) - 1]

    waiting = asyncio.ensure_future(
        appeared(feed, read, ID, wait=AppearWait(wait_s=30, fallback_s=30))
    )
    await first_read.wait()  # the first read found nothing; the wait awaits the id
    feed.notice(str(uuid.uuid4()))  # another call: the wait goes on, no read
    for _ in range(5):  # let the wait run, were it woken
        await asyncio.sleep(0)
    assert reads == 1
    assert not waiting.done()
    feed.notice(str(ID))
    view = await asyncio.wait_for(waiting, 1)  # woken at once, not after the fallback's 30 s
    assert view is not None
    assert view.invocation_id == ID
    assert reads == 2
    assert feed.waiting == 0


async def _no_rows() -> list[InvocationView]:
    return []
