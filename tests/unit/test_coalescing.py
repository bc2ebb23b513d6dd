"""The coalescer: calls made together are handled together, each gets its own answer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from toolfleet.coalescing import Coalescer

pytestmark = pytest.mark.unit


class Recorder:
    """A batch handler that doubles numbers and remembers its batches."""

    def __init__(self, *, handled_at_most: int | None = None) -> None:
        self.batches: list[list[int]] = []
        self.handled_at_most = handled_at_most

    async def handle(self, items: Sequence[int]) -> list[int | Exception]:
        await asyncio.sleep(0)  # a round trip
        self.batches.append(list(items))
        taken = items[: self.handled_at_most] if self.handled_at_most else items
        return [ValueError(f"odd {i}") if i < 0 else i * 2 for i in taken]


async def test_calls_made_together_share_one_batch_and_get_their_own_result() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.handle)
    assert await asyncio.gather(*(coalescer.submit(i) for i in range(50))) == [
        i * 2 for i in range(50)
    ]
    assert recorder.batches == [list(range(50))]


async def test_a_lone_call_is_a_batch_of_one() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.handle)
    assert await coalescer.submit(1) == 2
    assert await coalescer.submit(2) == 4
    assert recorder.batches == [[1], [2]]


async def test_calls_made_during_a_batch_go_into_the_next_one() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.handle)
    first = asyncio.create_task(coalescer.submit(1))
    await asyncio.sleep(0)  # the first batch is now on the wire
    rest = [asyncio.create_task(coalescer.submit(i)) for i in (2, 3)]
    assert await asyncio.gather(first, *rest) == [2, 4, 6]
    assert recorder.batches == [[1], [2, 3]]


async def test_an_enqueued_item_is_under_way_before_anyone_awaits_it() -> None:
    recorder = Recorder()
    coalescer = Coalescer(recorder.handle)
    answer = coalescer.enqueue(3)
    other = coalescer.enqueue(4)  # queued at once: the same batch
    for _ in range(3):
        await asyncio.sleep(0)  # nobody awaits the answers meanwhile
    assert recorder.batches == [[3, 4]]
    assert (answer.done(), await answer, await other) == (True, 6, 8)


async def test_batches_are_bounded_and_a_handled_prefix_leaves_the_rest_queued() -> None:
    recorder = Recorder(handled_at_most=2)
    coalescer = Coalescer(recorder.handle, max_batch=4)
    assert await asyncio.gather(*(coalescer.submit(i) for i in range(5))) == [
        0,
        2,
        4,
        6,
        8,
    ]
    assert recorder.batches == [[0, 1, 2, 3], [2, 3, 4], [4]]


async def test_an_error_result_reaches_only_its_caller() -> None:
    coalescer = Coalescer(Recorder().handle)
    results = await asyncio.gather(
        coalescer.submit(1), coalescer.submit(-1), coalescer.submit(2), return_exceptions=True
    )
    assert results[0] == 2
    assert isinstance(results[1], ValueError)
    assert results[2] == 4


async def test_a_failed_batch_fails_every_call_in_it_and_the_next_batch_runs() -> None:
    calls = 0

    async def flaky(items: Sequence[int]) -> list[int | Exception]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        if calls == 1:
            raise ConnectionError("the server went away")
        return list(items)

    coalescer = Coalescer(flaky)
    failed = await asyncio.gather(*(coalescer.submit(i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in failed)
    assert await coalescer.submit(7) == 7


async def test_a_handler_answering_for_nothing_fails_the_batch_instead_of_spinning() -> None:
    async def silent(_: Sequence[int]) -> list[int | Exception]:
        return []

    with pytest.raises(RuntimeError, match="0 results for a batch of 1"):
        await Coalescer(silent).submit(1)


async def test_a_caller_that_stops_waiting_leaves_the_others_their_results() -> None:
    coalescer = Coalescer(Recorder().handle)
    calls = [asyncio.create_task(coalescer.submit(i)) for i in range(4)]
    calls[1].cancel()
    results = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(results[1], asyncio.CancelledError)
    assert [results[0], results[2], results[3]] == [0, 4, 6]
