"""The console's pure parts: the timeline, the feed's fan-out, the live list's frames."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from toolfleet.api.console.timeline import TimelineMark, timeline
from toolfleet.api.feed import RESYNC, InvocationFeed, Subscription
from toolfleet.api.routes.events import follow_list, summary
from toolfleet.contract.http import ApprovalView, InvocationView
from toolfleet.events.models import InvocationStatus
from toolfleet.status.projection import Fact, Kind, LatestCheckpoint

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def _at(ms: int) -> datetime:
    return T0 + timedelta(milliseconds=ms)


def _view(status: InvocationStatus = InvocationStatus.RUNNING, **fields: Any) -> InvocationView:
    values: dict[str, Any] = {
        "invocation_id": uuid.UUID(int=1),
        "tenant_id": "t1",
        "tool_id": "core__long_running",
        "status": status,
        "created_at": T0,
        "updated_at": T0,
        **fields,
    }
    return InvocationView(**values)


def test_a_resumed_call_on_another_worker_shows_attempts_resumes_and_handovers() -> None:
    marks = [
        TimelineMark(kind="terminal", at=_at(5000), detail={"status": "success"}),
        TimelineMark(kind="checkpoint", at=_at(800), detail={"progress_percent": 40.0}),
        TimelineMark(kind="invoked", at=_at(100), detail={"attempt": 1, "worker_id": "w1"}),
        TimelineMark(kind="requested", at=_at(0)),
        TimelineMark(kind="authorized", at=_at(30)),
        TimelineMark(
            kind="invoked",
            at=_at(3000),
            detail={"attempt": 2, "worker_id": "w2", "resumed_from_checkpoint_id": "c1"},
        ),
    ]
    t = timeline(_view(InvocationStatus.SUCCESS, completed_at=_at(5000)), marks)
    assert [s.kind for s in t.steps] == [
        "requested",
        "authorized",
        "invoked",
        "checkpoint",
        "invoked",
        "terminal",
    ]
    assert [s.since_previous_ms for s in t.steps] == [0, 30, 70, 700, 2200, 2000]
    assert t.duration_ms == 5000
    assert (t.attempts, t.resumes, t.handovers) == (2, 1, 1)
    assert t.steps[4].label == "invoked (attempt 2, resumed, new worker)"
    assert t.steps[3].label == "checkpoint 40%"
    assert t.steps[-1].label == "outcome success"


def test_without_event_marks_the_row_tells_the_coarse_story() -> None:
    # Marks pruned after the dedupe TTL: the row still has creation, start and outcome.
    view = _view(
        InvocationStatus.ERROR,
        started_at=_at(50),
        completed_at=_at(950),
        error={"code": "timeout"},
        execution_metadata={
            "attempts": 3,
            "resumed_from_checkpoint_id": "c9",
            "checkpoints_created": [
                {"checkpoint_id": "c9", "timestamp": _at(400).isoformat()},
                {"checkpoint_id": "bad", "timestamp": "not a time"},
            ],
        },
    )
    t = timeline(view, [])
    assert [s.kind for s in t.steps] == ["requested", "invoked", "checkpoint", "terminal"]
    assert t.steps[-1].label == "outcome error: timeout"
    assert (t.attempts, t.resumes, t.handovers, t.duration_ms) == (3, 1, 0, 950)


def test_a_running_call_has_no_duration_yet() -> None:
    t = timeline(
        _view(), [TimelineMark(kind="requested", at=T0), TimelineMark(kind="unknown", at=_at(5))]
    )
    assert t.duration_ms is None
    assert [s.kind for s in t.steps] == ["requested"]


def test_facts_keep_only_what_the_timeline_shows() -> None:
    invoked = Fact(
        kind=Kind.INVOKED,
        invocation_id="i",
        tenant_id="t",
        occurred_at=T0,
        attempt=2,
        worker_id="w",
        parameters={"secret": "never"},
    )
    assert invoked.timeline_detail() == {"attempt": 2, "worker_id": "w"}
    checkpoint = LatestCheckpoint(
        checkpoint_id="c",
        checkpoint_type="micro",
        progress_percent=10,
        current_phase="p",
        timestamp=T0,
    )
    fact = Fact(
        kind=Kind.CHECKPOINT,
        invocation_id="i",
        tenant_id="t",
        occurred_at=T0,
        checkpoint=checkpoint,
    )
    assert fact.timeline_detail()["progress_percent"] == 10
    outcome = Fact(
        kind=Kind.TERMINAL,
        invocation_id="i",
        tenant_id="t",
        occurred_at=T0,
        status=InvocationStatus.ERROR,
        error={"code": "timeout", "message": "m"},
        result={"secret": "never"},
        execution_metadata={"attempts": 2},
    )
    assert outcome.timeline_detail() == {"status": "error", "error_code": "timeout", "attempts": 2}


def test_a_follower_sees_only_its_tenant_and_resyncs_when_it_falls_behind() -> None:
    mine = Subscription(tenant_id="t1", queue=asyncio.Queue(maxsize=2))
    admin = Subscription(tenant_id=None)
    for sub in (mine, admin):
        sub.offer(_view(tenant_id="t2"))
        sub.offer(_view())
    assert mine.queue.qsize() == 1
    assert admin.queue.qsize() == 2
    mine.offer(_view())
    mine.offer(_view())  # full: what waits is dropped, a resync is asked for instead
    assert [mine.queue.get_nowait() for _ in range(mine.queue.qsize())] == [RESYNC]


async def test_the_feed_reads_the_noticed_rows_once_and_fans_them_out() -> None:
    reads: list[list[uuid.UUID]] = []
    first, second = uuid.UUID(int=1), uuid.UUID(int=2)

    async def read_many(ids: Any) -> list[InvocationView]:
        reads.append(list(ids))
        return [_view(invocation_id=i) for i in ids]

    feed = InvocationFeed(read_many=read_many, gather_s=0)
    with feed.subscribe("t1") as sub:
        assert feed.subscribers == 1
        feed.notice(str(second))
        feed.notice(str(first))
        feed.notice(str(first))
        feed.notice("not an id")
        await feed.deliver()
        feed.resync()
    assert feed.subscribers == 0
    assert reads == [[first, second]]
    items = [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]
    assert [i.invocation_id for i in items if isinstance(i, InvocationView)] == [first, second]
    assert items[-1] == RESYNC


async def test_the_feed_runs_on_notices_and_stops() -> None:
    delivered = asyncio.Event()

    async def read_many(ids: Any) -> list[InvocationView]:
        delivered.set()
        return []

    feed = InvocationFeed(read_many=read_many, gather_s=0)
    stop = asyncio.Event()
    with feed.subscribe(None):
        runner = asyncio.create_task(feed.run(stop))
        feed.notice(str(uuid.UUID(int=3)))
        await asyncio.wait_for(delivered.wait(), timeout=5)
        stop.set()
        await asyncio.wait_for(runner, timeout=5)


async def test_the_live_list_starts_with_a_snapshot_and_follows_changes() -> None:
    pending = _view(
        InvocationStatus.PENDING_APPROVAL,
        result=None,
        approval=ApprovalView(
            tool_id="core__echo", tool_version="1.0.0", parameters={"a": 1}, parameters_hash=None
        ),
    )
    done = _view(InvocationStatus.SUCCESS, result={"big": "x" * 10})
    sub = Subscription(tenant_id="t1")

    async def snapshot() -> list[InvocationView]:
        return [pending]

    frames = follow_list(sub, snapshot, keepalive_s=0.01)
    first = await anext(frames)
    assert first.startswith("id: 1\nevent: snapshot\n")
    assert json.loads(first.split("data: ", 1)[1])["items"][0]["approval"]["parameters"] == {"a": 1}
    assert await anext(frames) == ": keep-alive\n\n"
    sub.offer(done)
    change = await anext(frames)
    assert "event: invocation" in change
    assert "result" not in json.loads(change.split("data: ", 1)[1])
    sub.offer(RESYNC)
    assert "event: snapshot" in await anext(frames)
    await frames.aclose()
    assert "result" not in summary(done)
