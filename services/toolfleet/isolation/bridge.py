"""Inside a sandbox: ``127.0.0.1:3128`` relayed to the egress proxy's unix socket.

The sandbox's network namespace has only loopback; HTTP clients expect a TCP proxy, so
the worker listens there and copies bytes both ways. The proxy, outside, decides. The
relay has a thread and an event loop of its own: a tool blocking its loop in a
synchronous HTTP call must not stall its own proxy connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

#: The proxy address tools see (``HTTPS_PROXY``/``HTTP_PROXY`` in their environment).
BRIDGE_HOST = "127.0.0.1"
BRIDGE_PORT = 3128
PROXY_URL = f"http://{BRIDGE_HOST}:{BRIDGE_PORT}"


class Bridge:
    """The relay's thread; :meth:`close` stops it."""

    def __init__(self, socket_path: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(_listen(socket_path))
            started.set()
            self._loop.run_forever()

        threading.Thread(target=serve, name="toolfleet-egress-bridge", daemon=True).start()
        started.wait(10)

    def close(self) -> None:
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._loop.call_soon_threadsafe(self._loop.stop)


async def start_bridge(socket_path: str) -> Bridge:
    """Listen on :data:`PROXY_URL` (in a thread); connections go to ``socket_path``."""
    return Bridge(socket_path)


async def _listen(socket_path: str) -> asyncio.Server:

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(socket_path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))

    return await asyncio.start_server(relay, host=BRIDGE_HOST, port=BRIDGE_PORT)


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()
