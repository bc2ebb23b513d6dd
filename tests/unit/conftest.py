"""Fixtures the unit tests of several modules share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from toolfleet.observability import tracing
from toolfleet.observability.tracing_sdk import RootIds


@pytest.fixture
def exported(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Every span the fleet's tracer ends, recorded (with the fleet's own root ids)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=RootIds(tracing.ROOT_IDS))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_tracer", provider.get_tracer("toolfleet"))
    monkeypatch.setattr(tracing, "_recording", True)
    monkeypatch.setattr(tracing, "_provider", provider)
    yield exporter
    provider.shutdown()
