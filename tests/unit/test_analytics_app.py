"""The analytics app's changelog writes leave faust's producer buffer before an event
is acknowledged, on faust's own buffer with a sender slower than its flush waits."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import faust
import pytest
from faust.transport.producer import ProducerBuffer

from toolfleet.analytics.app import drain


class SlowSender(ProducerBuffer):
    """faust's buffer, its background sender back for the next message only ``delay_s``
    after handing one over (a busy host, where the task waits for the loop)."""

    def __init__(self, app: faust.App, delay_s: float) -> None:
        super().__init__()
        self.app = app
        self.delay_s = delay_s
        self.sent: list[Any] = []

    async def _send_pending(self, fut: Any) -> None:
        self.sent.append(fut)  # handed to the Kafka producer
        await asyncio.sleep(self.delay_s)


Started = Callable[[float], Awaitable[SlowSender]]


@pytest.fixture
async def started() -> AsyncIterator[Started]:
    """Starts buffers with a given sender delay; each is stopped after the test."""
    app = faust.App("toolfleet-test-drain", broker="kafka://127.0.0.1:1", web_enabled=False)
    async with AsyncExitStack() as stack:

        async def start(delay_s: float) -> SlowSender:
            buffer = SlowSender(app, delay_s)
            await buffer.start()
            stack.push_async_callback(buffer.stop)
            return buffer

        yield start


async def test_faust_flush_gives_up_on_a_slow_sender_and_drain_does_not(
    started: Started,
) -> None:
    buffer = await started(0.15)
    for n in range(4):
        buffer.put(n)  # type: ignore[arg-type]  # table writes queued with send_soon
    await buffer.flush()
    # faust's flush returned with writes still queued: a commit after it could
    # cover an event whose writes a stop would then drop.
    assert buffer.size > 0
    await drain(buffer)
    assert buffer.size == 0
    assert buffer.sent == [0, 1, 2, 3]


async def test_drain_returns_at_once_when_nothing_is_queued(started: Started) -> None:
    buffer = await started(0.0)
    await drain(buffer)
    assert buffer.sent == []
