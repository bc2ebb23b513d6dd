"""Spans: joined to the request's trace when exported, free when not."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from toolfleet.observability import tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
REQUEST = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("toolfleet"))
    monkeypatch.setattr(tracing, "_recording", True)
    yield exporter
    provider.shutdown()


@pytest.fixture
def not_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_tracer", tracing._tracer)
    monkeypatch.setattr(tracing, "_recording", tracing._recording)
    tracing.configure_tracing(service="executor", exporter="none")


def test_an_exported_span_is_a_child_of_the_requests_trace(
    exported: InMemorySpanExporter,
) -> None:
    with tracing.span("process x", traceparent=REQUEST, attributes={"a": 1}) as current:
        assert current.is_recording()
    (finished,) = exported.get_finished_spans()
    assert format(finished.context.trace_id, "032x") == TRACE_ID
    assert finished.parent is not None
    assert format(finished.parent.span_id, "016x") == "00f067aa0ba902b7"


@pytest.mark.usefixtures("not_exported")
def test_without_an_exporter_spans_record_nothing() -> None:
    with tracing.span("process x", traceparent=REQUEST) as current:
        assert not current.is_recording()
    # The trace still travels: events carry their parent's traceparent, not the span's.
    assert tracing.trace_id_of(REQUEST) == TRACE_ID
