"""Observers (audit, status) are off the critical path (their broker profile paces them)
and see every hop of the calls the critical path holds: bounded by ``max_in_flight``
alone, they end a saturated run further behind (``bench/e2e_bench.py``'s "caught up"
figure), so they hold ``OBSERVER_IN_FLIGHT_SCALE`` times as many."""

from __future__ import annotations

from typing import Any, cast

from toolfleet.events import routing
from toolfleet.settings import FleetSettings
from toolfleet.worker import OBSERVER_IN_FLIGHT_SCALE, Resources


def resources(**settings: Any) -> Resources:
    unused = cast(Any, None)  # specs are built from settings alone
    return Resources(
        settings=FleetSettings(**settings),
        producer=unused,
        redis=unused,
        pool=unused,
        worker_id="w1",
    )


def test_observers_hold_more_records_than_a_critical_consumer() -> None:
    res = resources(max_in_flight=100, topic_prefix="p.")
    for route in (routing.AUDIT_CONSUMER, routing.STATUS_CONSUMER):
        spec = res.observer_spec(route)
        assert spec.max_in_flight == 100 * OBSERVER_IN_FLIGHT_SCALE
        assert spec.observer
        assert spec.fetch_max_wait_ms is None  # the profile's pace for observers
        assert spec.group_id == f"p.{route.group}"
        assert sorted(spec.topics) == sorted(f"p.{name}" for name in route.topics)


def test_policy_reads_outcomes_apart_at_observer_pace_and_requests_at_critical_pace() -> None:
    res = resources(max_in_flight=100, topic_prefix="p.")
    outcomes = res.observer_spec(routing.POLICY_OUTCOMES, scale=1)
    assert (outcomes.group_id, list(outcomes.topics)) == (
        "p.policy-outcomes",
        ["p.invoke.results"],
    )
    assert (outcomes.max_in_flight, outcomes.observer) == (100, True)
    critical = res.spec(routing.POLICY_CONSUMER)
    assert critical.group_id == "p.policy"
    assert "p.invoke.results" not in critical.topics
    assert not critical.observer  # the fleet's critical pace
    assert critical.fetch_max_wait_ms is None
    assert routing.party_of(routing.POLICY_OUTCOMES) is routing.POLICY
