"""The OpenTelemetry SDK's part of :mod:`toolfleet.observability.tracing`: a provider
that exports spans, with the fleet's root ids.

Imported by :func:`~toolfleet.observability.tracing.configure_tracing` only when spans
are exported: a worker that exports none (the default) does not load the SDK, its
resources and psutil under them (about 1.6 MB of every worker's memory, issue 36).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Literal

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator


class RootIds(RandomIdGenerator):
    """Random ids, except for the span :func:`~toolfleet.observability.tracing.trace_root`
    starts: the ids it sets in ``root_ids``."""

    def __init__(self, root_ids: ContextVar[tuple[int, int] | None]) -> None:
        self._root_ids = root_ids

    def generate_trace_id(self) -> int:
        ids = self._root_ids.get()
        return ids[0] if ids is not None else super().generate_trace_id()

    def generate_span_id(self) -> int:
        ids = self._root_ids.get()
        return ids[1] if ids is not None else super().generate_span_id()


def exporting_provider(
    *,
    service: str,
    exporter: Literal["console", "otlp"],
    traces_url: str | None,
    root_ids: ContextVar[tuple[int, int] | None],
) -> TracerProvider:
    """A provider of ``toolfleet-{service}`` spans, batched to ``exporter`` (OTLP: to
    ``traces_url``, else the exporter's ``OTEL_EXPORTER_OTLP_*`` default)."""
    provider = TracerProvider(
        resource=Resource.create({"service.name": f"toolfleet-{service}"}),
        id_generator=RootIds(root_ids),
    )
    if exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url)))
    return provider
