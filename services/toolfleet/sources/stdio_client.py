"""The stdio transport of MCP sources: a server's messages read off the event loop, each
capped in size.

The ``mcp`` SDK's own stdio client reads on the executor's event loop and joins every
chunk to all that came before it, so one huge message costs time quadratic in its size,
on the loop every tenant's calls share. Here a reader thread per session reads the
server's stdout (``os.read``, which waits without the GIL), frames it with
:class:`LineFramer` (linear: each byte is scanned once and copied at most twice) and
parses each message; the loop only receives parsed messages through a bounded queue,
so a slow or flooding server stalls its own session and nothing else.

A message longer than the source's ``max_response_bytes`` is not read further: the
call it answers fails ``result_too_large`` (every call in flight on the session, when
the message does not say which request it answers), and the session ends; its
supervisor (:class:`~toolfleet.sources.pool.ServerSession`) starts the server again.
At most ``max_response_bytes`` plus one read chunk is held per session.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import anyio
import mcp_types as types
import pydantic_core
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.shared.message import SessionMessage

#: Bytes one ``os.read`` asks for (the pipe's own buffer size on Linux).
READ_CHUNK = 65_536
#: Parsed messages waiting for the session; the reader waits when it is full.
QUEUE_SIZE = 8
#: How much of an oversized message is parsed to find the request it answers.
_HEAD_BYTES = 4096
#: JSON-RPC error code (implementation-defined range) of a message over the cap.
TOO_LARGE_CODE = -32099
#: Time a server has to exit after its stdin closes, then after SIGTERM.
_GRACE_S = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Overflow:
    """A message passed the cap: what the session learns instead of the message."""

    limit: int
    """The cap it passed (bytes)."""
    request_id: int | str | None
    """The request it answers, when its first bytes say so."""


@dataclass(kw_only=True)
class LineFramer:
    """Newline-delimited messages from a byte stream, each at most ``max_bytes`` long.

    Linear time: a chunk is scanned once for newlines (``bytes.find`` from where the last
    search stopped) and a message's bytes are copied once into the pending buffer and
    once out of it. ``scanned`` and ``copied`` count that work (the unit tests read them).
    """

    max_bytes: int
    scanned: int = 0
    copied: int = 0
    _pending: bytearray = field(default_factory=bytearray)
    _overflowed: bool = False

    def feed(self, chunk: bytes) -> list[bytes | Overflow]:
        """The messages ``chunk`` completes; an :class:`Overflow` ends the stream."""
        if self._overflowed:
            return []
        found: list[bytes | Overflow] = []
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            self.scanned += end - start + (newline >= 0)
            if len(self._pending) + end - start > self.max_bytes:
                found.append(self._overflow(chunk[start:end]))
                return found
            if newline < 0:
                self._pending += chunk[start:]
                self.copied += len(chunk) - start
                return found
            if self._pending:
                self._pending += chunk[start:newline]
                line = bytes(self._pending)
                self.copied += (newline - start) + len(line)
                self._pending.clear()
            else:
                line = chunk[start:newline]
                self.copied += len(line)
            if line.strip():
                found.append(line)
            start = newline + 1

    def _overflow(self, tail: bytes) -> Overflow:
        self._overflowed = True
        head = (bytes(self._pending[:_HEAD_BYTES]) + tail[:_HEAD_BYTES])[:_HEAD_BYTES]
        self._pending = bytearray()  # the memory goes back now, not at the session's end
        return Overflow(limit=self.max_bytes, request_id=_request_id(head))


def _request_id(head: bytes) -> int | str | None:
    """The ``id`` of a (truncated) JSON-RPC response, parsed by pydantic-core."""
    try:
        parsed = pydantic_core.from_json(head, allow_partial=True)
    except ValueError:
        return None
    found = parsed.get("id") if isinstance(parsed, dict) else None
    return found if isinstance(found, int | str) and not isinstance(found, bool) else None


Item = SessionMessage | Exception | Overflow
#: What a transport yields to ``mcp.Client``: the server's messages, and where to send ours.
TransportStreams = tuple[
    MemoryObjectReceiveStream[SessionMessage | Exception], MemoryObjectSendStream[SessionMessage]
]


def parse(line: bytes) -> SessionMessage | Exception:
    """One message; a parse error is a value the session surfaces (as the SDK does)."""
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:
        return exc


class PipeReader(threading.Thread):
    """Reads ``fd`` until EOF, an overflow or :meth:`stop`; hands items to ``deliver``.

    ``deliver`` blocks while the session is behind (its queue is full) and returns
    False once nobody listens any more.
    """

    def __init__(
        self,
        fd: int,
        *,
        max_bytes: int,
        deliver: Callable[[Item | None], bool],
        name: str,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.framer = LineFramer(max_bytes=max_bytes)
        self._fd = fd
        self._deliver = deliver
        self._wake_r, self._wake_w = os.pipe()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def run(self) -> None:
        try:
            while True:
                ready, _, _ = select.select([self._fd, self._wake_r], [], [])
                if self._wake_r in ready:
                    return
                chunk = os.read(self._fd, READ_CHUNK)
                if not chunk:
                    return
                for framed in self.framer.feed(chunk):
                    item = framed if isinstance(framed, Overflow) else parse(framed)
                    if not self._deliver(item) or isinstance(item, Overflow):
                        return
        except OSError:
            return
        finally:
            self._deliver(None)  # end of stream
            os.close(self._wake_r)
            os.close(self._wake_w)


@dataclass(kw_only=True)
class StdioConnection:
    """One session's transport (an ``mcp.Client`` server): open it once, then read
    :attr:`overflow` to learn why it ended."""

    server: StdioServerParameters
    max_message_bytes: int
    overflow: Overflow | None = None
    """Set when the server sent a message over the cap (the session then ended)."""
    _cm: contextlib.AbstractAsyncContextManager[TransportStreams] | None = None

    async def __aenter__(self) -> TransportStreams:
        self._cm = self._open()
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc: object) -> None:
        assert self._cm is not None
        await self._cm.__aexit__(None, None, None)

    @asynccontextmanager
    async def _open(self) -> AsyncIterator[TransportStreams]:
        loop = asyncio.get_running_loop()
        read_fd, write_fd = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                self.server.command,
                *self.server.args,
                stdin=asyncio.subprocess.PIPE,
                stdout=write_fd,
                env=get_default_environment() | (self.server.env or {}),
                cwd=self.server.cwd,
                start_new_session=True,  # its whole tree is stopped with it
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        items: asyncio.Queue[Item | None] = asyncio.Queue(maxsize=QUEUE_SIZE)
        closing = threading.Event()

        def deliver(item: Item | None) -> bool:
            if closing.is_set():
                return False
            sent = asyncio.run_coroutine_threadsafe(items.put(item), loop)
            while not closing.is_set():
                try:
                    sent.result(timeout=0.1)
                    return True
                except TimeoutError:
                    continue
                except Exception:  # the loop is gone
                    return False
            sent.cancel()
            return False

        reader = PipeReader(
            read_fd,
            max_bytes=self.max_message_bytes,
            deliver=deliver,
            name=f"mcp-stdio-{process.pid}",
        )
        read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)

        async def pump() -> None:
            async with read_send:
                while (item := await items.get()) is not None:
                    if isinstance(item, Overflow):
                        self.overflow = item
                        await _answer_overflow(read_send, item)
                        return  # the session ends here; its supervisor restarts it
                    await read_send.send(item)

        async def write() -> None:
            assert process.stdin is not None
            try:
                async with write_recv:
                    async for message in write_recv:
                        line = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                        process.stdin.write(line.encode() + b"\n")
                        await process.stdin.drain()
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                await read_send.aclose()

        reader.start()
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(pump)
                tasks.start_soon(write)
                try:
                    yield read_recv, write_send
                finally:
                    closing.set()
                    reader.stop()
                    with anyio.CancelScope(shield=True):
                        await _stop(process, hard=self.overflow is not None)
                        await asyncio.to_thread(reader.join, 5.0)
                    tasks.cancel_scope.cancel()
        finally:
            os.close(read_fd)
            for stream in (read_recv, write_send):
                await stream.aclose()


async def _answer_overflow(
    read_send: MemoryObjectSendStream[SessionMessage | Exception], overflow: Overflow
) -> None:
    """The answer the session sees instead of an oversized one."""
    if overflow.request_id is None:
        return
    error = types.JSONRPCError(
        jsonrpc="2.0",
        id=overflow.request_id,
        error=types.ErrorData(
            code=TOO_LARGE_CODE, message=f"a message over {overflow.limit} bytes"
        ),
    )
    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
        await read_send.send(SessionMessage(error))


async def _stop(process: asyncio.subprocess.Process, *, hard: bool) -> None:
    """Close stdin and let the server exit; else SIGTERM, then SIGKILL, its group. A
    server that flooded is killed at once: it is not read any more, so it cannot exit."""
    if process.stdin is not None:
        process.stdin.close()
    signals = [signal.SIGKILL] if hard else [signal.SIGTERM, signal.SIGKILL]
    if not hard and await _exited(process, _GRACE_S):
        return
    for sig in signals:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        if await _exited(process, _GRACE_S):
            return


async def _exited(process: asyncio.subprocess.Process, timeout: float) -> bool:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), timeout)
    return process.returncode is not None
