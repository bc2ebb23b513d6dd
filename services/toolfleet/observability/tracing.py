"""OpenTelemetry tracing in one place: spans around process and send, W3C context.

The ``traceparent`` of the original request travels on every event, so every service's
``process`` span joins one trace per invocation. A request that arrives without one gets
it where it is decoded (:func:`toolfleet.events.identity.with_trace`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Literal

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from toolfleet.events.identity import derived_traceparent, new_traceparent, parse_traceparent

if TYPE_CHECKING:  # the SDK is imported when spans are exported (tracing_sdk.py)
    from opentelemetry.sdk.trace import TracerProvider

_PROPAGATOR = TraceContextTextMapPropagator()
_tracer: trace.Tracer = trace.get_tracer("toolfleet")
_recording = True
"""False once :func:`configure_tracing` chose no exporter: :func:`span` is then free."""
_provider: TracerProvider | None = None
"""The provider :func:`configure_tracing` installed, flushed by :func:`shutdown_tracing`."""
OTLP_TRACES_PATH = "/v1/traces"
ROOT_IDS: ContextVar[tuple[int, int] | None] = ContextVar("toolfleet_root_ids", default=None)
"""The ids of the span :func:`trace_root` starts (``tracing_sdk.RootIds`` gives them)."""


def configure_tracing(
    *, service: str, exporter: Literal["none", "console", "otlp"], endpoint: str | None = None
) -> None:
    """Install a tracer provider that exports to ``exporter``.

    With ``exporter='none'`` (the default) spans are the API's no-op ones: nothing is
    recorded, so nothing is paid for per event. Trace context still travels, because
    every event carries its parent's ``traceparent`` whatever the current span is.
    ``otlp`` sends OTLP/HTTP (protobuf) to ``endpoint`` + ``/v1/traces`` (without an
    endpoint, to the exporter's ``OTEL_EXPORTER_OTLP_*`` default).
    """
    global _tracer, _recording, _provider
    shutdown_tracing()
    _recording = exporter != "none"
    if exporter == "none":
        _tracer = trace.NoOpTracer()
        return
    from toolfleet.observability.tracing_sdk import exporting_provider

    provider = exporting_provider(
        service=service, exporter=exporter, traces_url=traces_url(endpoint), root_ids=ROOT_IDS
    )
    _provider = provider
    _tracer = provider.get_tracer("toolfleet")


def traces_url(endpoint: str | None) -> str | None:
    """The OTLP/HTTP traces URL of a collector's base ``endpoint`` (``None`` stays unset)."""
    if not endpoint:
        return None
    base = endpoint.rstrip("/")
    return base if base.endswith(OTLP_TRACES_PATH) else base + OTLP_TRACES_PATH


def shutdown_tracing() -> None:
    """Export the spans still buffered and stop exporting (worker and API shutdown)."""
    global _provider, _tracer
    provider, _provider = _provider, None
    if provider is not None:
        provider.shutdown()  # flushes every BatchSpanProcessor first
        _tracer = trace.NoOpTracer()


def current_traceparent() -> str:
    """The current span's ``traceparent``, or a new one when no span is active."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent") or new_traceparent()


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
    if not _records():  # nothing would record it: skip parsing the trace context too
        yield trace.INVALID_SPAN
        return
    with _tracer.start_as_current_span(
        name, context=_context_of(traceparent, tracestate), kind=kind, attributes=attributes
    ) as current:
        yield current


def recording() -> bool:
    """Whether spans are recorded (see :func:`_records`)."""
    return _records()


def _records() -> bool:
    """Whether a span started now is recorded: tracing configured here with an exporter
    (a worker, the API), or, in a process that never configured it (the SDK inside an
    agent platform), once the application installed OpenTelemetry's global provider.
    Until then the API's spans are no-ops, and building one cost the client about 11 us
    per call for nothing."""
    if _provider is not None:
        return True
    return _recording and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


@contextmanager
def batch_span(
    name: str,
    *,
    traceparents: Sequence[str | None],
    attributes: dict[str, str | int] | None = None,
) -> Iterator[Span]:
    """One consumer span for records handled together, linked to each record's trace
    (OpenTelemetry's messaging conventions for batch processing). When every record
    belongs to one trace, the span is also that trace's child, so the trace shows it."""
    if not _records():
        yield trace.INVALID_SPAN
        return
    links: list[trace.Link] = []
    contexts: list[Context] = []
    for traceparent in dict.fromkeys(t for t in traceparents if t):
        context = _context_of(traceparent, None)
        if context is not None:
            contexts.append(context)
            links.append(trace.Link(trace.get_current_span(context).get_span_context()))
    traces = {link.context.trace_id for link in links}
    parent = contexts[0] if len(traces) == 1 else Context()
    with _tracer.start_as_current_span(
        name, context=parent, kind=SpanKind.CONSUMER, links=links, attributes=attributes
    ) as current:
        yield current


@contextmanager
def trace_root(
    name: str,
    *,
    traceparent: str | None,
    source: str,
    event_id: str,
    kind: SpanKind = SpanKind.CONSUMER,
    attributes: dict[str, str | int] | None = None,
) -> Iterator[Span]:
    """The root span of the trace an event without ``traceparent`` started, if this is one.

    :func:`~toolfleet.events.identity.with_trace` gave such an event a ``traceparent``
    derived from its ``source`` + ``id``; this span is the parent it names (same trace
    id, same span id), so the spans of every service hang under one root. Only the
    service that starts traces (policy) records it, or a trace would have one per
    service; for any other event this is a no-op.
    """
    parsed = parse_traceparent(traceparent)
    if not _records() or parsed is None or traceparent != derived_traceparent(source, event_id):
        yield trace.INVALID_SPAN
        return
    ids = ROOT_IDS.set((int(parsed.trace_id, 16), int(parsed.parent_id, 16)))
    try:
        root = _tracer.start_span(name, context=Context(), kind=kind, attributes=attributes)
    finally:
        ROOT_IDS.reset(ids)
    with trace.use_span(root, end_on_exit=True):
        yield root


RUNNER_CALL_PREFIX = "tfc_"
"""Idempotency keys the agent runner sets: its call ids (``toolfleet.agent``)."""


def tool_span_attributes(
    tool_id: str, tool_version: str, *, idempotency_key: str | None
) -> dict[str, str | int]:
    """The run span's attributes: OpenTelemetry's GenAI conventions for tool execution
    (``execute_tool``), beside toolfleet's own. ``gen_ai.tool.call.id`` is the agent
    runner's call id when the call came from it. No parameter or result values."""
    attributes: dict[str, str | int] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool_id,
        "gen_ai.tool.type": "function",
        "toolfleet.tool.id": tool_id,
        "toolfleet.tool.version": tool_version,
    }
    if idempotency_key and idempotency_key.startswith(RUNNER_CALL_PREFIX):
        attributes["gen_ai.tool.call.id"] = idempotency_key
    return attributes


def tool_span_name(tool_id: str) -> str:
    """``execute_tool {tool}``, the GenAI conventions' span name for a tool's run."""
    return f"execute_tool {tool_id}"


def mark_failed(current: Span, error_type: str) -> None:
    """Set ``error.type`` (the contract's error code) and an error status on ``current``."""
    if current.is_recording():
        current.set_attribute("error.type", error_type)
        current.set_status(trace.Status(trace.StatusCode.ERROR))
