"""Spans: joined to the request's trace when exported, free when not."""

from __future__ import annotations

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.support.otlp import otlp_collector
from toolfleet.events.identity import derived_traceparent, parse_traceparent, trace_id_of
from toolfleet.observability import tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
REQUEST = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
def not_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_tracer", tracing._tracer)
    monkeypatch.setattr(tracing, "_recording", tracing._recording)
    monkeypatch.setattr(tracing, "_provider", tracing._provider)
    tracing.configure_tracing(service="executor", exporter="none")


@pytest.fixture
def library(monkeypatch: pytest.MonkeyPatch) -> None:
    """toolfleet inside an application that never configured its tracing (the SDK)."""
    monkeypatch.setattr(tracing, "_recording", True)
    monkeypatch.setattr(tracing, "_provider", None)
    monkeypatch.setattr(otel_trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(tracing, "_tracer", otel_trace.get_tracer("toolfleet"))


def test_in_an_application_without_opentelemetry_a_span_costs_no_parsing(
    library: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def parsed(*_: object) -> None:
        raise AssertionError("the trace context was parsed for a span nobody records")

    monkeypatch.setattr(tracing, "_context_of", parsed)
    with tracing.span("send x", traceparent=REQUEST) as current:
        assert not current.is_recording()
    assert not tracing.recording()


def test_the_sdks_spans_join_the_applications_provider_once_it_installs_one(
    library: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tracing.span("send x", traceparent=REQUEST) as before:
        assert not before.is_recording()
    monkeypatch.setattr(otel_trace, "_TRACER_PROVIDER", provider)  # the app's set_tracer_provider
    with tracing.span("send x", traceparent=REQUEST) as current:
        assert current.is_recording()
    (finished,) = exporter.get_finished_spans()
    assert format(finished.context.trace_id, "032x") == TRACE_ID
    provider.shutdown()


def test_an_exported_span_is_a_child_of_the_requests_trace(
    exported: InMemorySpanExporter,
) -> None:
    with tracing.span("process x", traceparent=REQUEST, attributes={"a": 1}) as current:
        assert current.is_recording()
    (finished,) = exported.get_finished_spans()
    assert format(finished.context.trace_id, "032x") == TRACE_ID
    assert finished.parent is not None
    assert format(finished.parent.span_id, "016x") == "00f067aa0ba902b7"


def test_the_trace_a_bare_request_starts_has_its_root(exported: InMemorySpanExporter) -> None:
    started = derived_traceparent("/agents/a1", "evt-1")
    ids = parse_traceparent(started)
    assert ids is not None
    with (
        tracing.trace_root("start x", traceparent=started, source="/agents/a1", event_id="evt-1"),
        tracing.span("process x", traceparent=started),
    ):
        with tracing.span("execute y"):
            pass
        with tracing.span("send z", traceparent=started):
            pass
    spans = {s.name: s for s in exported.get_finished_spans()}
    root = spans.pop("start x")
    assert root.parent is None
    assert format(root.context.trace_id, "032x") == ids.trace_id
    assert format(root.context.span_id, "016x") == ids.parent_id
    # Every other span is in its trace, and every parent is a span that was exported.
    known = {root.context.span_id} | {s.context.span_id for s in spans.values()}
    for child in spans.values():
        assert child.context.trace_id == root.context.trace_id
        assert child.parent is not None
        assert child.parent.span_id in known
    # Spans after it get ids of their own again.
    with tracing.span("later"):
        pass
    (*_, later) = exported.get_finished_spans()
    assert later.context.trace_id != root.context.trace_id


def test_a_callers_trace_gets_no_second_root(exported: InMemorySpanExporter) -> None:
    with tracing.trace_root("start x", traceparent=REQUEST, source="/a", event_id="e") as root:
        assert not root.is_recording()
    assert exported.get_finished_spans() == ()


@pytest.mark.usefixtures("not_exported")
def test_without_an_exporter_spans_record_nothing() -> None:
    with tracing.span("process x", traceparent=REQUEST) as current:
        assert not current.is_recording()
    # The trace still travels: events carry their parent's traceparent, not the span's.
    assert trace_id_of(REQUEST) == TRACE_ID


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("http://collector:4318/", "http://collector:4318/v1/traces"),
        ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
        (None, None),
    ],
)
def test_the_otlp_endpoint_is_the_collectors_base_url(
    endpoint: str | None, url: str | None
) -> None:
    assert tracing.traces_url(endpoint) == url


def test_otlp_exports_from_a_default_install_and_flushes_at_shutdown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tracing, "_tracer", tracing._tracer)
    monkeypatch.setattr(tracing, "_recording", tracing._recording)
    monkeypatch.setattr(tracing, "_provider", None)
    # Longer than the test: only the flush at shutdown can deliver the span.
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")
    with otlp_collector() as collector:
        tracing.configure_tracing(service="executor", exporter="otlp", endpoint=collector.url)
        with tracing.span("process x", traceparent=REQUEST) as current:
            assert current.is_recording()
        started = derived_traceparent("/agents/a1", "evt-1")
        with tracing.trace_root(
            "start y", traceparent=started, source="/agents/a1", event_id="evt-1"
        ):
            pass
        assert collector.received() == []
        tracing.shutdown_tracing()
        received, root = collector.received()
    assert (received.service, received.name, received.trace_id) == (
        "toolfleet-executor",
        "process x",
        TRACE_ID,
    )
    assert received.parent_span_id == "00f067aa0ba902b7"
    # The configured provider gives a started trace's root the ids its events name.
    ids = parse_traceparent(started)
    assert ids is not None
    assert (root.name, root.trace_id) == ("start y", ids.trace_id)
    with tracing.span("after shutdown") as current:
        assert not current.is_recording()
