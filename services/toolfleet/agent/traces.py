"""The run's spans when OpenTelemetry is installed, nothing when it is not.

The runner works on a core install (no ``opentelemetry``); with it (the ``fleet`` or
``api`` extras, or an application that brings it), ``run_agent`` opens its
``invoke_agent`` and turn spans through :mod:`toolfleet.observability.tracing`, and each
call is submitted with the current span's ``traceparent`` so the fleet's spans join the
agent's trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from toolfleet.events.identity import new_traceparent

__all__ = ["RunSpan", "current_traceparent", "run_span"]


class RunSpan(Protocol):
    """What the loop does with a span: set attributes."""

    def set_attribute(self, key: str, value: str | int) -> None: ...


class _NoSpan:
    def set_attribute(self, key: str, value: str | int) -> None:
        return None


@contextmanager
def _no_span(name: str, *, attributes: dict[str, str | int] | None = None) -> Iterator[RunSpan]:
    yield _NoSpan()


def run_span(
    name: str, *, attributes: dict[str, str | int] | None = None
) -> AbstractContextManager[RunSpan]:
    """A span named ``name`` (a no-op without OpenTelemetry or a tracer provider)."""
    try:
        from toolfleet.observability.tracing import span
    except ImportError:  # a core install: no OpenTelemetry
        return _no_span(name, attributes=attributes)
    return span(name, attributes=attributes)


def current_traceparent() -> str:
    """The current span's ``traceparent`` (a new trace without one, or without
    OpenTelemetry)."""
    try:
        from toolfleet.observability import tracing
    except ImportError:
        return new_traceparent()
    return tracing.current_traceparent()
