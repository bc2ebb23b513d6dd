"""The executor's listing job over the in-memory queue: what an operator reads of a
listing (ready, failed with a typed error, retried), and what a hostile source cannot
do to the job (crash it, hang it, or make it register what the registry refuses)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from tests.support.eventually import eventually
from toolfleet.errors import ErrorCode, ExternalApiError
from toolfleet.sources.listing import (
    ListingJob,
    MemoryListingQueue,
    checked,
    retry_delay_s,
)
from toolfleet.sources.mcp_tools import source_tool
from toolfleet.sources.models import (
    Discovery,
    ListingLimits,
    ListingState,
    SourceDefinition,
    SourceKind,
    SourceTool,
)

pytestmark = pytest.mark.unit


def stdio(name: str, **more: Any) -> SourceDefinition:
    return SourceDefinition(name=name, kind=SourceKind.MCP_STDIO, target="server", **more)


def tools_of(source: SourceDefinition, *names: str) -> list[SourceTool]:
    from mcp.types import Tool

    return [source_tool(source, Tool(name=n, input_schema={"type": "object"})) for n in names]


class Lister:
    """A :class:`SourceLister` whose answer per source the test chooses."""

    def __init__(self) -> None:
        self.answers: dict[str, Callable[[SourceDefinition], Any]] = {}
        self.recorded: list[tuple[list[str], Discovery]] = []
        self.asked: list[str] = []

    async def listed(self, source: SourceDefinition) -> list[SourceTool]:
        self.asked.append(source.name)
        result = self.answers[source.name](source)
        if asyncio.iscoroutine(result):
            result = await result
        assert isinstance(result, list)
        return result

    async def record(self, tools: list[SourceTool], *, via: Discovery) -> object:
        self.recorded.append(([t.tool_id for t in tools], via))
        return None


def job(
    queue: MemoryListingQueue, lister: Lister, worker: str = "executor-1", **more: Any
) -> ListingJob:
    return ListingJob(queue=queue, lister=lister, worker=worker, poll_s=0.01, **more)


async def run_until(running: ListingJob, done: Callable[[], bool], *, timeout: float = 10) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(running.run(stop))
    try:
        assert await eventually(lambda: asyncio.sleep(0, result=done()), timeout=timeout)
        assert not task.done()  # the job is alive after whatever it listed
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)


async def test_a_listing_is_ready_with_its_tools_registered() -> None:
    queue, lister = MemoryListingQueue(), Lister()
    source = stdio("good")
    lister.answers["good"] = lambda s: tools_of(s, "add", "sub")
    assert queue.request(source).state is ListingState.PENDING

    await run_until(job(queue, lister), lambda: queue.get("good").state is ListingState.READY)  # type: ignore[union-attr]
    listing = queue.get("good")
    assert listing is not None
    assert (listing.tools, listing.listed_by, listing.error) == (2, "executor-1", None)
    assert lister.recorded == [(["mcp__good__add", "mcp__good__sub"], "add")]


async def slow(source: SourceDefinition) -> list[SourceTool]:
    await asyncio.Event().wait()  # never answers
    raise AssertionError("unreachable")


def garbage(source: SourceDefinition) -> list[SourceTool]:
    raise KeyError("result")  # what a malformed answer may make a dependency raise


def unreachable(source: SourceDefinition) -> list[SourceTool]:
    raise ExternalApiError("the MCP server could not be started or reached")


@pytest.mark.parametrize(
    ("answer", "code", "retryable"),
    [
        (slow, ErrorCode.TIMEOUT, True),
        (garbage, ErrorCode.INTERNAL_ERROR, True),
        (unreachable, ErrorCode.EXTERNAL_API_ERROR, True),
        (lambda s: tools_of(s, *(f"t{i}" for i in range(6))), ErrorCode.RESULT_TOO_LARGE, False),
        (lambda s: tools_of(s, "a-b", "a_b"), ErrorCode.RESULT_VALIDATION_FAILED, False),
        (lambda s: tools_of(s, "x" * 200), ErrorCode.RESULT_VALIDATION_FAILED, False),
    ],
    ids=["slow", "garbage", "unreachable", "too-many", "colliding-names", "id-too-long"],
)
async def test_a_hostile_answer_fails_its_own_listing_typed_and_the_job_goes_on(
    answer: Callable[[SourceDefinition], Any], code: ErrorCode, retryable: bool
) -> None:
    queue, lister = MemoryListingQueue(), Lister()
    hostile, good = stdio("hostile", timeout_s=0.2), stdio("good")
    lister.answers |= {"hostile": answer, "good": lambda s: tools_of(s, "add")}
    queue.request(hostile)
    queue.request(good)
    limits = ListingLimits(max_tools=5)

    def both_done() -> bool:
        states = {queue.get(n).state for n in ("hostile", "good")}  # type: ignore[union-attr]
        return ListingState.PENDING not in states

    await run_until(job(queue, lister, limits=limits), both_done)
    failed, ready = queue.get("hostile"), queue.get("good")
    assert failed is not None
    assert ready is not None
    assert ready.state is ListingState.READY
    assert failed.state is ListingState.FAILED
    assert failed.error is not None
    assert (failed.error.code, failed.error.retryable) == (code, retryable)
    assert "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx" not in (
        failed.error.message
    )  # a hostile name is quoted shortened, if at all
    # Retryable: tried again after a while; not retryable: only a new request does.
    assert (failed.next_attempt_at is not None) is retryable
    assert [t for t, _ in lister.recorded] == [["mcp__good__add"]]  # nothing of the hostile


async def test_a_retryable_failure_is_tried_again_once_due() -> None:
    queue, lister = MemoryListingQueue(), Lister()
    source = stdio("flaky")
    lister.answers["flaky"] = unreachable
    queue.request(source)
    claim = await queue.claim("executor-1", lease_margin_s=30)
    assert claim is not None
    assert await queue.finish(claim, "executor-1", await job(queue, lister).list_one(claim))
    failed = queue.get("flaky")
    assert failed is not None
    assert failed.next_attempt_at == queue.now + timedelta(seconds=retry_delay_s(1))
    assert await queue.claim("executor-2", lease_margin_s=30) is None  # not due yet

    queue.now = failed.next_attempt_at
    lister.answers["flaky"] = lambda s: tools_of(s, "add")
    again = await queue.claim("executor-2", lease_margin_s=30)
    assert again is not None
    assert again.attempts == 2
    result = await job(queue, lister, "executor-2").list_one(again)
    assert await queue.finish(again, "executor-2", result)
    assert queue.get("flaky").state is ListingState.READY  # type: ignore[union-attr]
    assert queue.get("flaky").tools == 1  # type: ignore[union-attr]


def test_retries_back_off_to_ten_minutes() -> None:
    assert [retry_delay_s(n) for n in (1, 2, 3)] == [30.0, 60.0, 120.0]
    assert retry_delay_s(10_000) == 600.0


async def test_a_listing_requested_again_drops_the_older_answer() -> None:
    queue, lister = MemoryListingQueue(), Lister()
    old = stdio("moving")
    lister.answers["moving"] = lambda s: tools_of(s, "old")
    queue.request(old)
    claim = await queue.claim("executor-1", lease_margin_s=30)
    assert claim is not None
    queue.request(stdio("moving", timeout_s=5))  # the operator replaced it meanwhile
    result = await job(queue, lister).list_one(claim)
    assert result.error is not None
    assert result.error.code is ErrorCode.STATE_CONFLICT
    assert lister.recorded == []  # the old definition's tools are not registered
    assert not await queue.finish(claim, "executor-1", result)
    assert queue.get("moving").state is ListingState.PENDING  # type: ignore[union-attr]


async def test_a_listing_requested_for_another_tenant_lists_nothing() -> None:
    queue, lister = MemoryListingQueue(), Lister()
    theirs = stdio("theirs", tenant_id="tenant_a")
    lister.answers["theirs"] = lambda s: tools_of(s, "secret")
    queue.request(theirs)
    # The row says tenant_b asked (the source changed hands, or the row was forged):
    row = queue.rows["theirs"]
    row.listing = row.listing.model_copy(update={"tenant_id": "tenant_b"})
    claim = await queue.claim("executor-1", lease_margin_s=30)
    assert claim is not None
    result = await job(queue, lister).list_one(claim)
    assert result.error is not None
    assert result.error.code is ErrorCode.PERMISSION_DENIED
    assert lister.asked == []  # never started with tenant_a's credentials for tenant_b


async def test_a_stopping_job_hands_its_listing_back() -> None:
    queue, lister = MemoryListingQueue(), Lister()
    lister.answers["slow"] = slow
    queue.request(stdio("slow", timeout_s=300))
    stop = asyncio.Event()
    task = asyncio.create_task(job(queue, lister).run(stop))
    assert await eventually(lambda: asyncio.sleep(0, result=lister.asked == ["slow"]), timeout=5)
    stop.set()
    await asyncio.wait_for(task, timeout=5)
    claim = await queue.claim("executor-2", lease_margin_s=30)  # at once, not at the lease's end
    assert claim is not None
    assert claim.attempts == 1


def test_checked_refuses_what_the_registry_would() -> None:
    source = stdio("s")
    assert [t.remote_name for t in checked(source, tools_of(source, "a", "b"))] == ["a", "b"]
    with pytest.raises(Exception, match="two tools named as mcp__s__a_b"):
        checked(source, tools_of(source, "a.b", "a-b"))


def test_the_cli_waits_for_the_listing_and_says_why_when_none_came() -> None:
    from toolfleet.cli.sources import listing_problem, wait_for_listing

    now = [0.0]
    answers = iter([{"state": "pending"}, {"state": "ready", "tools": 3}])
    got = wait_for_listing(
        lambda: next(answers),
        {"state": "pending"},
        wait_s=60,
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    assert got == {"state": "ready", "tools": 3}
    assert now[0] == 1.0  # two half-second polls

    now[0] = 0.0
    pending = wait_for_listing(
        lambda: {"state": "pending"},
        {"state": "pending"},
        wait_s=2,
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    problem = listing_problem("gh", pending, waited_s=2)
    assert problem is not None
    assert "no executor listed its tools within 2 s" in problem
    assert "toolfleet worker executor" in problem
    assert listing_problem("gh", pending, waited_s=0) is None  # --wait 0: nobody waited

    failed = {
        "state": "failed",
        "error": {"code": "timeout", "message": "the source gh did not list its tools"},
        "next_attempt_at": "2026-01-01T00:00:30Z",
    }
    problem = listing_problem("gh", failed, waited_s=60)
    assert problem is not None
    assert "listing its tools failed: timeout: the source gh did not list" in problem
    assert "executors try again at 2026-01-01T00:00:30Z" in problem
