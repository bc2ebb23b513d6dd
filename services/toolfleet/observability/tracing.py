"""OpenTelemetry tracing in one place: spans around process and send, W3C context.

The ``traceparent`` of the original request travels on every event, so every service's
``process`` span joins one trace per invocation.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_tracer: trace.Tracer = trace.get_tracer("toolfleet")
_recording = True
"""False once :func:`configure_tracing` chose no exporter: :func:`span` is then free."""


def configure_tracing(
    *, service: str, exporter: Literal["none", "console", "otlp"], endpoint: str | None = None
) -> None:
    """Install a tracer provider that exports to ``exporter``.

    With ``exporter='none'`` (the default) spans are the API's no-op ones: nothing is
    recorded, so nothing is paid for per event. Trace context still travels, because
    every event carries its parent's ``traceparent`` whatever the current span is.
    """
    global _tracer, _recording
    _recording = exporter != "none"
    if not _recording:
        _tracer = trace.NoOpTracer()
        return
    provider = TracerProvider(resource=Resource.create({"service.name": f"toolfleet-{service}"}))
    if exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif exporter == "otlp":  # pragma: no cover - needs an OTLP collector
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[import-not-found]
            OTLPSpanExporter,
        )

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    _tracer = provider.get_tracer("toolfleet")


def new_traceparent() -> str:
    """A fresh W3C ``traceparent`` for a request that arrives without one."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def current_traceparent() -> str:
    """The current span's ``traceparent``, or a new one when no span is active."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent") or new_traceparent()


def trace_id_of(traceparent: str | None) -> str | None:
    if traceparent and len(traceparent) >= 55:
        return traceparent[3:35]
    return None


def _context_of(traceparent: str | None, tracestate: str | None) -> Context | None:
    if not traceparent:
        return None
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    return _PROPAGATOR.extract(carrier)


@contextmanager
def span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    traceparent: str | None = None,
    tracestate: str | None = None,
    attributes: dict[str, str | int] | None = None,
) -> Iterator[Span]:
    """A span; given a ``traceparent`` it becomes that remote trace's child."""
    if not _recording:  # nothing would record it: skip parsing the trace context too
        yield trace.INVALID_SPAN
        return
    with _tracer.start_as_current_span(
        name, context=_context_of(traceparent, tracestate), kind=kind, attributes=attributes
    ) as current:
        yield current
