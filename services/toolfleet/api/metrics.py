"""HTTP metrics for ``/metrics``: labelled by route template and status, never by tenant."""

from __future__ import annotations

import time

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HTTP_REQUESTS = Counter(
    "toolfleet_http_requests_total",
    "HTTP requests the API answered.",
    ["method", "route", "status"],
)
HTTP_SECONDS = Histogram(
    "toolfleet_http_request_seconds",
    "Time to answer an HTTP request.",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

#: Route label of requests no route matched: raw paths would explode cardinality.
UNMATCHED = "<unmatched>"


class HttpMetricsMiddleware:
    """Pure ASGI middleware counting and timing every HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        status = 500
        started = time.perf_counter()

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self._app(scope, receive, record_status)
        finally:
            # The router stores the matched route in the scope: its template, not the
            # path, is the label (``/v1/invocations/{invocation_id}``).
            route = getattr(scope.get("route"), "path", UNMATCHED)
            method = str(scope.get("method", ""))
            HTTP_REQUESTS.labels(method, route, str(status)).inc()
            HTTP_SECONDS.labels(method, route).observe(time.perf_counter() - started)
