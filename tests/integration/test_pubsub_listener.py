"""The fleet's pub/sub listener against the real Redis: it sleeps while idle, yet stops
at once and never misses a message or a new channel."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.support.eventually import eventually
from toolfleet.storage import pubsub
from toolfleet.storage.pubsub import listen_with_reconnect
from toolfleet.storage.redis import connect_redis

pytestmark = pytest.mark.integration


async def test_an_idle_listener_hears_messages_and_new_channels_and_stops_at_once(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Settled from the start, waiting 30 s per poll: only messages and the stop move it.
    monkeypatch.setattr(pubsub, "_SETTLE_S", 0.0)
    monkeypatch.setattr(pubsub, "_IDLE_POLL_S", 30.0)
    client = connect_redis(redis_url)
    channel = f"toolfleet:test:{uuid.uuid4().hex}"
    heard: list[str] = []
    extra: set[str] = set()
    subscribed = asyncio.Event()
    lost: list[bool] = []
    stop = asyncio.Event()

    async def on_message(text: str) -> None:
        heard.append(text)

    listener = asyncio.create_task(
        listen_with_reconnect(
            client,
            channel,
            on_message,
            stop,
            after_subscribe=subscribed.set,
            after_connection_lost=lambda: lost.append(True),
            more_channels=lambda: extra,
        )
    )
    try:
        await asyncio.wait_for(subscribed.wait(), 5)
        await client.publish(channel, "one")
        await eventually(lambda: _now(heard == ["one"]))
        # A channel named after the listener started is subscribed to after its next
        # message (or poll).
        extra.add(f"{channel}:more")
        await client.publish(channel, "nudge")

        async def more_heard() -> bool:
            await client.publish(f"{channel}:more", "two")
            return "two" in heard

        await eventually(more_heard, timeout=5)
        loop = asyncio.get_running_loop()
        started = loop.time()
        stop.set()
        await asyncio.wait_for(listener, 2)
        # It was waiting on a poll of 30 s; the stop did not wait for it.
        assert loop.time() - started < 1.0
        assert lost == [True]
    finally:
        listener.cancel()
        await client.aclose()


async def _now(value: bool) -> bool:
    return value
