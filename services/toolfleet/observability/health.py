"""A worker's HTTP endpoints: Prometheus metrics, liveness and readiness on one port.

``toolfleet worker NAME`` serves them on ``TOOLFLEET_METRICS_HOST:TOOLFLEET_METRICS_PORT``
from a thread of its own, so a scrape never waits for the event loop:

- ``/metrics``: prometheus_client's exposition of the process's registry.
- ``/livez``: 200 while the event loop is responsive. A task of the loop stamps a
  monotonic heartbeat every second; the thread answers 503 once the stamp is older than
  ``stale_after_s``. A thread that answered on its own would stay up while the loop
  that does the work is stuck.
- ``/readyz``: 200 once the worker's producer is started and each of its consumers has
  joined its group at least once (with or without partitions: a member beyond the
  partition count is ready too, or a rolling update at full scale would wait for it
  forever), until it stops; 503 with a one-line JSON reason otherwise.

The bodies say how old the heartbeat is and which consumer groups wait: nothing of a
call, a tenant or a setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any, NoReturn, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app

METRICS_PATH = "/metrics"
LIVENESS_PATH = "/livez"
READINESS_PATH = "/readyz"
ROUTES = (METRICS_PATH, LIVENESS_PATH, READINESS_PATH)
"""The paths a worker serves; any other is 404."""

HEARTBEAT_INTERVAL_S = 1.0
"""How often the event loop stamps its heartbeat."""
STALE_AFTER_S = 10.0
"""A heartbeat older than this and the loop is stuck: ``/livez`` answers 503."""


@dataclass(frozen=True, kw_only=True)
class ProbeAnswer:
    """What a probe answers: its verdict and a one-line JSON body."""

    ok: bool
    body: dict[str, object]

    @property
    def status(self) -> str:
        return "200 OK" if self.ok else "503 Service Unavailable"

    def encode(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":")).encode() + b"\n"


class WorkerHealth:
    """Whether a worker's event loop turns and whether it is ready to consume.

    Written by the event loop (:meth:`beat`, :meth:`serving`), read by the HTTP server's
    threads (:meth:`liveness`, :meth:`readiness`): each write replaces one attribute, so a
    reader sees the old value or the new one.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        stale_after_s: float = STALE_AFTER_S,
        stopping: Callable[[], bool] = lambda: False,
    ) -> None:
        """``clock``: monotonic seconds (injected by tests). ``stopping``: whether the
        worker was told to stop (its stop event's ``is_set``)."""
        self._clock = clock
        self._stale_after_s = stale_after_s
        self._stopping = stopping
        self._stamp = clock()
        self._consumers: tuple[tuple[str, Callable[[], bool]], ...] | None = None

    def beat(self) -> None:
        """Stamp the heartbeat (called from the event loop)."""
        self._stamp = self._clock()

    async def heartbeat(self, *, interval_s: float = HEARTBEAT_INTERVAL_S) -> NoReturn:
        """Stamp the heartbeat every ``interval_s`` until cancelled."""
        while True:
            self.beat()
            await asyncio.sleep(interval_s)

    def serving(self, consumers: Iterable[tuple[str, Callable[[], bool]]]) -> None:
        """The producer is started and these consumers are built: each is its consumer
        group and a callable saying whether it has joined its group yet."""
        self._consumers = tuple(consumers)

    def liveness(self) -> ProbeAnswer:
        age = max(self._clock() - self._stamp, 0.0)
        return ProbeAnswer(
            ok=age <= self._stale_after_s,
            body={"live": age <= self._stale_after_s, "heartbeat_age_s": round(age, 3)},
        )

    def readiness(self) -> ProbeAnswer:
        reason = self._not_ready()
        if reason is None:
            return ProbeAnswer(ok=True, body={"ready": True})
        return ProbeAnswer(ok=False, body={"ready": False, "reason": reason})

    def _not_ready(self) -> str | None:
        if self._stopping():
            return "stopping"
        consumers = self._consumers
        if consumers is None:
            return "starting: producer and consumers not up yet"
        waiting = sorted({group for group, assigned in consumers if not assigned()})
        if waiting:
            return f"joining groups: {', '.join(waiting)}"
        return None


def health_app(health: WorkerHealth, *, registry: CollectorRegistry = REGISTRY) -> WSGIApplication:
    """The WSGI app of a worker's endpoints (:data:`ROUTES`)."""
    metrics = cast(WSGIApplication, make_wsgi_app(registry))

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == METRICS_PATH:
            return metrics(environ, start_response)
        probe = {LIVENESS_PATH: health.liveness, READINESS_PATH: health.readiness}.get(path)
        if probe is None:
            return _plain(start_response, "404 Not Found", b"not found\n")
        method = environ.get("REQUEST_METHOD", "GET")
        if method not in ("GET", "HEAD"):
            return _plain(start_response, "405 Method Not Allowed", b"use GET\n", allow=True)
        answer = probe()
        body = answer.encode()
        start_response(
            answer.status,
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
            ],
        )
        return [b"" if method == "HEAD" else body]

    return app


def _plain(
    start_response: StartResponse, status: str, body: bytes, *, allow: bool = False
) -> list[bytes]:
    headers = [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
    if allow:
        headers.append(("Allow", "GET, HEAD"))
    start_response(status, headers)
    return [body]


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per request: a slow client holds its own thread, not the probes'."""

    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    """No access log line on stderr per scrape and probe."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve_http(
    health: WorkerHealth, *, host: str, port: int, registry: CollectorRegistry = REGISTRY
) -> Iterator[tuple[str, int]]:
    """Serve :func:`health_app` on ``host:port`` from a daemon thread until the block
    ends; yields the address bound (``port`` 0: a free one)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(_ThreadingServer):
        address_family = family  # an IPv6 host (``::``) needs an IPv6 socket

    server = make_server(
        host, port, health_app(health, registry=registry), Server, handler_class=_QuietHandler
    )
    thread = threading.Thread(
        target=server.serve_forever,
        name="toolfleet-health",
        daemon=True,
        kwargs={"poll_interval": 0.5},
    )
    thread.start()
    try:
        bound = server.server_address
        yield str(bound[0]), int(bound[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@asynccontextmanager
async def serve_endpoints(
    health: WorkerHealth, *, host: str, port: int, registry: CollectorRegistry = REGISTRY
) -> AsyncIterator[tuple[str, int]]:
    """The worker's endpoints (:func:`serve_http`) and the event loop's heartbeat that
    ``/livez`` reads, until the block ends; yields the address bound."""
    beating = asyncio.create_task(health.heartbeat(), name="toolfleet-heartbeat")
    try:
        with serve_http(health, host=host, port=port, registry=registry) as address:
            yield address
    finally:
        beating.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beating
