"""``toolfleet doctor``'s topic checks against the in-memory broker: each gap said once,
by the check it belongs to."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from toolfleet.bus.topics import default_topics_file
from toolfleet.doctor.kafka import MemoryBroker
from toolfleet.doctor.results import CheckStatus, Profile
from toolfleet.doctor.topics import (
    check_replication,
    check_retention,
    check_topics,
    fleet_specs,
    production_replication,
    production_specs,
    read_topics,
)
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.unit

SETTINGS = FleetSettings(topic_prefix="tf.", topic_partitions=4, topic_replication=1)
OK, WARN, FAIL = CheckStatus.OK, CheckStatus.WARN, CheckStatus.FAIL


async def created(settings: FleetSettings, pools: set[str] | None = None) -> MemoryBroker:
    """A broker whose topics toolfleet created as configured."""
    broker = MemoryBroker()
    await broker.topics.create(fleet_specs(settings, pools or {"default"}))
    return broker


async def statuses(
    broker: MemoryBroker,
    settings: FleetSettings = SETTINGS,
    *,
    pools: set[str] | None = None,
    profile: Profile = "kafka",
) -> dict[str, tuple[CheckStatus, str]]:
    in_use = pools or {"default"}
    specs = fleet_specs(settings, in_use)
    facts = await read_topics(broker, specs)
    results = [
        check_topics(specs, facts),
        check_retention(specs, facts),
        check_replication(specs, production_specs(settings, in_use), facts, profile=profile),
    ]
    return {r.name: (r.status, r.detail) for r in results}


async def test_topics_as_configured_pass_and_single_replicas_fail_only_production() -> None:
    found = await statuses(await created(SETTINGS))
    assert found["topics"] == (OK, "8 topics match topics.yaml, 4 partitions each")
    assert found["retention"][0] is OK
    assert found["replication"] == (
        FAIL,
        "all 8 topics: replication 1 < 3, min.insync.replicas 1 < 2 "
        "(topics.yaml's production sizes: survive a broker loss)",
    )
    dev = await statuses(await created(SETTINGS), profile="dev")
    assert dev["replication"][0] is WARN


async def test_production_sizes_pass_under_the_kafka_profile() -> None:
    settings = SETTINGS.model_copy(update={"topic_replication": 3})
    broker = await created(settings)
    broker.replicas = dict.fromkeys(broker.topics.topics, 3)
    found = await statuses(broker, settings)
    assert {name: status for name, (status, _) in found.items()} == dict.fromkeys(
        ("topics", "retention", "replication"), OK
    )
    assert found["replication"][1] == "replication 3, min.insync.replicas 2"


async def test_a_missing_topic_fails_topics_and_nothing_else() -> None:
    broker = await created(SETTINGS)
    del broker.topics.topics["tf.audit"]
    found = await statuses(broker, profile="dev")
    assert found["topics"] == (FAIL, "missing tf.audit")
    assert found["retention"][0] is OK
    assert "tf.audit" not in found["replication"][1]


async def test_a_wrong_partition_count_fails_whatever_the_profile() -> None:
    broker = await created(SETTINGS)
    broker.topics.topics["tf.dlq"] = replace(broker.topics.topics["tf.dlq"], partitions=3)
    found = await statuses(broker, profile="dev")
    assert found["topics"] == (FAIL, "tf.dlq: 3 partitions, want 4 (TOOLFLEET_TOPIC_PARTITIONS)")


async def test_retention_drift_fails_retention_only() -> None:
    broker = await created(SETTINGS)
    state = broker.topics.topics["tf.invoke.executed"]
    broker.topics.topics[state.name] = replace(
        state, config={**state.config, "retention.ms": "604800000"}
    )
    found = await statuses(broker, profile="dev")
    assert found["topics"][0] is OK
    status, detail = found["retention"]
    assert status is FAIL
    assert "tf.invoke.executed: retention.ms is 604800000, want 21600000" in detail
    assert "toolfleet init --apply" in detail


async def test_sizes_below_the_configuration_fail_even_under_dev() -> None:
    settings = SETTINGS.model_copy(update={"topic_replication": 3})
    broker = await created(settings)
    broker.replicas = dict.fromkeys(broker.topics.topics, 3)
    broker.replicas["tf.audit"] = 1
    state = broker.topics.topics["tf.dlq"]
    broker.topics.topics["tf.dlq"] = replace(
        state, config={**state.config, "min.insync.replicas": "1"}
    )
    found = await statuses(broker, settings, profile="dev")
    status, detail = found["replication"]
    assert status is FAIL
    assert "tf.audit: replication 1, TOOLFLEET_TOPIC_REPLICATION says 3" in detail
    assert "tf.dlq: min.insync.replicas 1, want 2" in detail
    assert found["retention"][0] is OK  # min.insync.replicas is replication's to say


async def test_a_pool_in_use_needs_its_topic() -> None:
    broker = await created(SETTINGS)  # only the contract's topics
    found = await statuses(broker, pools={"default", "gpu"})
    assert found["topics"] == (FAIL, "missing tf.invoke.authorized.gpu")
    served = await created(SETTINGS, {"default", "gpu"})
    found = await statuses(served, pools={"default", "gpu"})
    assert found["topics"] == (OK, "9 topics (1 of pools) match topics.yaml, 4 partitions each")


def test_a_pool_topic_is_configured_as_the_authorized_topic() -> None:
    specs = {s.name: s for s in fleet_specs(SETTINGS, {"default", "gpu"})}
    assert specs["tf.invoke.authorized.gpu"].config == specs["tf.invoke.authorized"].config
    assert "tf.invoke.authorized.default" not in specs


def test_production_sizes_come_from_the_file(tmp_path: Path) -> None:
    assert production_replication() == 3
    doc = yaml.safe_load(default_topics_file().read_text())
    del doc["defaults"]["replication_factor"]
    path = tmp_path / "topics.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert production_replication(path) is None
    assert {s.replication for s in production_specs(SETTINGS, {"default"}, path)} == {1}
