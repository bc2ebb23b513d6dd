"""The routing table is whole, and the published AsyncAPI document says what it says.

How each handler's consumers come from the table is checked against the real services
in ``tests/integration/test_routing.py``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from toolfleet.events import routing
from toolfleet.events.routing import DEAD_LETTER, ROUTING, Consumer, types_on
from toolfleet.events.types import LIFECYCLE_TOPICS, TOPIC_OF_TYPE, EventType, TopicName
from toolfleet.worker import SERVICES

pytestmark = pytest.mark.unit

ASYNCAPI = Path(__file__).resolve().parents[2] / "schemas" / "asyncapi.yaml"
FLEET = [party for party in ROUTING if party.name in SERVICES]


def _published_operations() -> set[tuple[str, str, str, tuple[str, ...]]]:
    """(party, action, topic, message names) of every operation in ``schemas/``."""
    doc: dict[str, Any] = yaml.safe_load(ASYNCAPI.read_text(encoding="utf-8"))
    found = set()
    for op in doc["operations"].values():
        channel_id = op["channel"]["$ref"].removeprefix("#/channels/")
        channel = doc["channels"][channel_id]
        names = []
        for ref in op["messages"]:
            message_id = ref["$ref"].rsplit("/", 1)[-1]
            names.append(doc["components"]["messages"][message_id]["name"])
        address = channel["address"].removeprefix("toolfleet.")
        found.add((op["tags"][0]["name"], op["action"], address, tuple(names)))
    return found


POOL_TOPICS = "invoke.authorized.{pool}"
"""The AsyncAPI channel of every executor pool's topic (a route with ``pools``)."""


def _message_names(topic: TopicName, types: tuple[EventType, ...]) -> tuple[str, ...]:
    if types:
        return tuple(t.value for t in types)
    assert topic is TopicName.AUDIT  # only the structured audit topic lists no types
    return ("audit",)


def test_the_published_asyncapi_operations_are_the_routing_table() -> None:
    expected = set()
    for party in ROUTING:
        sends = [*party.sends, DEAD_LETTER] if party.dead_letters else party.sends
        for action, routes in (("receive", party.reads), ("send", sends)):
            for route in routes:
                names = _message_names(route.topic, route.types)
                expected.add((party.name, action, route.topic.value, names))
                if route.pools:
                    expected.add((party.name, action, POOL_TOPICS, names))
    assert _published_operations() == expected


def test_every_service_of_the_fleet_has_its_row_with_consumers() -> None:
    assert [party.name for party in FLEET] == list(SERVICES)
    for party in FLEET:
        assert party.source is not None
        assert party.consumers, party.name
        assert party.dead_letters, party.name


def test_each_route_names_only_types_that_travel_on_its_topic() -> None:
    for party in ROUTING:
        for route in (*party.reads, *party.sends):
            assert all(TOPIC_OF_TYPE[t] is route.topic for t in route.types), (party, route)
            assert route.summary


def test_consumer_names_and_groups_are_unique() -> None:
    consumers = [c for party in ROUTING for c in party.consumers]
    assert not [n for n, k in Counter(c.name for c in consumers).items() if k > 1]
    assert not [g for g, k in Counter(c.group for c in consumers).items() if k > 1]


def test_no_topic_of_the_pipeline_is_written_without_a_reader_or_read_without_a_writer() -> None:
    written = {r.topic for party in ROUTING for r in party.sends}
    read = {r.topic for party in ROUTING for r in party.reads}
    assert written - {TopicName.DLQ} == read - {TopicName.DLQ}
    assert set(TopicName) - {TopicName.DLQ} == written


def test_every_type_a_party_sends_is_read_by_someone_on_its_topic() -> None:
    # An untyped route (the structured audit topic) reads every type on its topic.
    read = {
        (r.topic, t) for party in ROUTING for r in party.reads for t in r.types or types_on(r.topic)
    }
    for party in ROUTING:
        for route in party.sends:
            for event_type in route.types:
                assert (route.topic, event_type) in read, (party.name, event_type)


@pytest.mark.parametrize(
    "observer", [routing.AUDIT_CONSUMER, routing.STATUS_CONSUMER], ids=lambda c: c.name
)
def test_observers_read_every_type_of_every_lifecycle_topic(observer: Consumer) -> None:
    assert observer.topics == LIFECYCLE_TOPICS
    read = {t for r in observer.reads for t in r.types}
    assert read == {t for t, topic in TOPIC_OF_TYPE.items() if topic in LIFECYCLE_TOPICS}


def test_each_consumer_belongs_to_one_party() -> None:
    assert routing.party_of(routing.EXECUTOR_CANCELS) is routing.EXECUTOR
    stray = Consumer(name="stray", group="stray", reads=())
    with pytest.raises(LookupError):
        routing.party_of(stray)
