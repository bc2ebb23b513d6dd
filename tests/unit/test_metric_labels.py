"""A producer picks an event's ``type``: it must not pick the fleet's metric series."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.bus.runtime import ConsumerSpec, EventConsumer, Inbound
from toolfleet.events.types import EventType
from toolfleet.observability import metrics
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.unit


class _NoOutput:
    async def send_all(self, outputs: Sequence[Outbound]) -> None:
        raise AssertionError("nothing is sent")


async def _handler(event: Inbound) -> Sequence[Outbound]:
    return []


def _types_labelled(service: str) -> set[str]:
    return {
        sample.labels["type"]
        for family in metrics.EVENTS_PROCESSED.collect()
        for sample in family.samples
        if sample.labels.get("service") == service
    }


def test_event_types_from_the_wire_are_labelled_unknown_unless_the_fleet_knows_them() -> None:
    runtime = EventConsumer(
        ConsumerSpec(service="labels-test", source="/toolfleet/test", group_id="g", topics=["t"]),
        _handler,
        settings=FleetSettings(),
        producer=cast(EventProducer, _NoOutput()),
        processed=None,
        dlq_topic="dlq",
    )
    hostile = [f"evil.{n}" for n in range(2000)]
    for event_type in [*hostile, EventType.SUCCEEDED.value]:
        counted, _ = runtime._core.metrics_of(event_type, "ok")
        counted.inc()
    assert _types_labelled("labels-test") == {"unknown", EventType.SUCCEEDED.value}


@given(st.text(max_size=64))
def test_a_label_is_a_known_type_or_unknown(event_type: str) -> None:
    label = metrics.event_type_label(event_type)
    assert label in metrics.KNOWN_EVENT_TYPES | {metrics.UNKNOWN_EVENT_TYPE}
    assert (label == event_type) == (event_type in metrics.KNOWN_EVENT_TYPES)
