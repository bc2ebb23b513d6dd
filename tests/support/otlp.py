"""An OTLP/HTTP trace collector in the test process: what exported spans look like on arrival.

It answers ``POST /v1/traces`` as a collector does (protobuf in, an empty
``ExportTraceServiceResponse`` out) and keeps every span it decoded.
"""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReceivedSpan:
    service: str
    """``service.name`` of the exporting process's resource."""
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str | None


@dataclass
class Collector:
    url: str
    """Base URL, what ``TOOLFLEET_OTEL_ENDPOINT`` is set to."""
    spans: list[ReceivedSpan] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def received(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.received() if s.trace_id == trace_id]

    def add(self, body: bytes, path: str) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans: list[ReceivedSpan] = []
        for resource_spans in request.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            service = attributes.get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        ReceivedSpan(
                            service=service,
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex() or None,
                        )
                    )
        with self.lock:
            self.paths.append(path)
            self.spans.extend(spans)


@contextlib.contextmanager
def otlp_collector() -> Iterator[Collector]:
    """A collector listening on a free local port until the block ends."""
    collector: Collector | None = None

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            assert collector is not None
            collector.add(body, self.path)
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: object) -> None:
            return  # the test's output is not the place for access logs

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    host, port = server.server_address[:2]
    collector = Collector(url=f"http://{host!s}:{port}")
    thread = threading.Thread(target=server.serve_forever, name="otlp-collector", daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
