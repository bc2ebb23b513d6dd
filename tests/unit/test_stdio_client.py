"""The stdio MCP transport's framing: linear in the bytes read, capped, off the loop."""

from __future__ import annotations

import asyncio
import os
import threading
import tracemalloc

from hypothesis import given
from hypothesis import strategies as st

from toolfleet.sources.stdio_client import READ_CHUNK, LineFramer, Overflow, PipeReader

MIB = 1_048_576


def test_a_64_mib_message_is_scanned_once_and_stops_at_the_cap() -> None:
    framer = LineFramer(max_bytes=4 * MIB)
    head = b'{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"'
    chunks = [head] + [b"A" * READ_CHUNK] * (64 * MIB // READ_CHUNK)
    tracemalloc.start()
    found: list[bytes | Overflow] = []
    fed = 0
    for chunk in chunks:
        found += framer.feed(chunk)
        fed += len(chunk)
        if found:
            break
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert found == [Overflow(limit=4 * MIB, request_id=7)]
    # Each byte looked at once; nothing past the cap's chunk was read or kept.
    assert framer.scanned <= fed <= 4 * MIB + 2 * READ_CHUNK
    assert framer.copied <= fed
    assert peak < 8 * MIB  # the pending buffer and its growth, not 64 MiB or a square
    assert framer.feed(b"more\n") == []  # the stream ended at the overflow


@given(st.lists(st.binary(max_size=300), max_size=40), st.integers(1, 97))
def test_framing_is_linear_and_splits_like_split_lines(parts: list[bytes], size: int) -> None:
    data = b"".join(parts)
    framer = LineFramer(max_bytes=1 << 20)
    found: list[bytes | Overflow] = []
    for at in range(0, len(data), size):
        found += framer.feed(data[at : at + size])
    assert found == [line for line in data.split(b"\n")[:-1] if line.strip()]
    assert framer.scanned == len(data)
    assert framer.copied <= 2 * len(data)


def test_a_message_over_the_cap_without_an_id_blames_no_request() -> None:
    framer = LineFramer(max_bytes=10)
    assert framer.feed(b'{"result": 1, "x": "' + b"A" * 20) == [Overflow(limit=10, request_id=None)]


async def test_the_reader_reads_off_the_event_loop() -> None:
    loop_thread = threading.get_ident()
    readers: set[int] = set()
    items: list[object] = []
    read_fd, write_fd = os.pipe()

    def deliver(item: object) -> bool:
        readers.add(threading.get_ident())
        items.append(item)
        return True

    reader = PipeReader(read_fd, max_bytes=MIB, deliver=deliver, name="test-reader")
    reader.start()
    os.write(write_fd, b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    os.write(write_fd, b"A" * (MIB + 1))
    await asyncio.to_thread(reader.join, 10)
    os.close(write_fd)
    os.close(read_fd)
    assert loop_thread not in readers
    assert len(items) == 3  # the message, the overflow, the end of the stream
    assert isinstance(items[1], Overflow)
    assert items[2] is None
