"""Prometheus metrics. Labels name services and event types, never tenants."""

from __future__ import annotations

from typing import Final

from prometheus_client import Counter, Gauge, Histogram

from toolfleet.events.types import EventType

KNOWN_EVENT_TYPES: Final = frozenset(t.value for t in EventType)
"""The event types a ``type`` label may hold: the fleet's own (the routing table's)."""
UNKNOWN_EVENT_TYPE: Final = "unknown"
"""The ``type`` label of any other event: a producer cannot mint series."""


def event_type_label(event_type: str) -> str:
    """``event_type`` as a metric label: itself when the fleet knows it, else
    :data:`UNKNOWN_EVENT_TYPE` (event types come from the wire)."""
    return event_type if event_type in KNOWN_EVENT_TYPES else UNKNOWN_EVENT_TYPE


EVENTS_PROCESSED = Counter(
    "toolfleet_events_processed_total",
    "Events a service finished processing, by outcome.",
    ["service", "type", "outcome"],
)
PROCESSING_SECONDS = Histogram(
    "toolfleet_event_processing_seconds",
    "Time from taking an event to its outputs being acknowledged.",
    ["service", "type"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
DLQ_RECORDS = Counter(
    "toolfleet_dlq_records_total", "Messages a service sent to the DLQ.", ["service", "reason"]
)
IN_FLIGHT = Gauge("toolfleet_in_flight_events", "Events being processed now.", ["service"])
CONSUMERS_RESTING = Gauge(
    "toolfleet_consumers_resting",
    "Consumers resting once caught up (partitions paused until a topic they read rings).",
    ["service"],
)
OUTCOMES_REFUSED = Counter(
    "toolfleet_outcomes_refused_total",
    "Outcomes a reader ignored: unsigned, forged, or signed for another call.",
    ["reader", "refusal"],  # reader: status, policy, client; refusal: OutcomeRefusalKind
)
DUPLICATES_SKIPPED = Counter(
    "toolfleet_duplicate_events_total", "Redelivered events skipped by dedupe.", ["service"]
)
TOOL_EXECUTIONS = Counter(
    "toolfleet_tool_executions_total", "Tool runs by the executor.", ["tool_id", "status"]
)
TOOL_SECONDS = Histogram(
    "toolfleet_tool_execution_seconds",
    "Tool run time.",
    ["tool_id"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300),
)
GENAI_TOOL_SECONDS = Histogram(
    "gen_ai_client_operation_duration_seconds",
    "OpenTelemetry GenAI gen_ai.client.operation.duration of tool runs (execute_tool).",
    ["gen_ai_operation_name", "gen_ai_tool_name", "error_type"],
    buckets=(
        0.01,
        0.02,
        0.04,
        0.08,
        0.16,
        0.32,
        0.64,
        1.28,
        2.56,
        5.12,
        10.24,
        20.48,
        40.96,
        81.92,
    ),
)
"""The GenAI conventions' duration metric (its bucket boundaries), beside
``toolfleet_tool_execution_seconds``; ``error_type`` is empty on success."""
LEASE_EVENTS = Counter(
    "toolfleet_execution_lease_events_total",
    "Execution leases taken over from a lapsed owner, lost to a newer epoch, or found "
    "finished on a redelivery (the recorded outcome was replayed).",
    ["event"],
)
