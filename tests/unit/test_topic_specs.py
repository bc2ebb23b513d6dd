"""topics.yaml as toolfleet applies it, and drift found against the in-memory admin."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from toolfleet.bus.admin import MemoryTopicAdmin
from toolfleet.bus.topics import (
    Drift,
    TopicAdminError,
    TopicMode,
    TopicsFileError,
    TopicState,
    default_topics_file,
    load_topic_specs,
    sync_topics,
)
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DAY_MS = 24 * 3600 * 1000
SETTINGS = FleetSettings(topic_prefix="tf.", topic_partitions=4, topic_replication=1)


def test_the_installed_file_is_the_one_infra_points_at() -> None:
    assert default_topics_file().read_bytes() == (ROOT / "infra" / "topics.yaml").read_bytes()


def test_retention_and_cleanup_come_from_the_file_over_its_defaults() -> None:
    specs = {spec.name: spec for spec in load_topic_specs(SETTINGS)}
    assert specs["tf.audit"].config["retention.ms"] == str(90 * DAY_MS)
    assert specs["tf.invoke.executed"].config["retention.ms"] == str(6 * 3_600_000)
    assert specs["tf.dlq"].config["retention.ms"] == str(14 * DAY_MS)
    for spec in specs.values():
        assert spec.config["cleanup.policy"] == "delete"
        assert spec.config["max.message.bytes"] == "1048576"
        assert (spec.partitions, spec.replication) == (4, 1)
    assert len(specs) == 8


def test_min_insync_replicas_never_exceeds_the_replication_factor() -> None:
    one = load_topic_specs(SETTINGS)
    three = load_topic_specs(SETTINGS.model_copy(update={"topic_replication": 3}))
    assert {s.config["min.insync.replicas"] for s in one} == {"1"}
    assert {s.config["min.insync.replicas"] for s in three} == {"2"}


def test_a_file_that_misses_a_contract_topic_is_refused(tmp_path: Path) -> None:
    doc = yaml.safe_load(default_topics_file().read_text())
    del doc["topics"]["audit"]
    path = tmp_path / "topics.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(TopicsFileError, match=r"missing: \['audit'\]"):
        load_topic_specs(SETTINGS, path)
    with pytest.raises(TopicsFileError, match="cannot read topics"):
        load_topic_specs(SETTINGS, tmp_path / "absent.yaml")


async def test_create_makes_every_topic_with_its_configs_then_finds_no_drift() -> None:
    admin = MemoryTopicAdmin()
    specs = load_topic_specs(SETTINGS)
    first = await sync_topics(admin, specs, mode=TopicMode.CREATE)
    assert sorted(first.created) == sorted(s.name for s in specs)
    assert admin.topics["tf.audit"].config["retention.ms"] == str(90 * DAY_MS)
    again = await sync_topics(admin, specs, mode=TopicMode.CREATE)
    assert again.created == []
    assert again.clean


async def test_check_changes_nothing_and_reports_missing_topics_and_drift() -> None:
    admin = MemoryTopicAdmin()
    admin.topics["tf.audit"] = TopicState(
        name="tf.audit", partitions=4, config={"retention.ms": "1000", "cleanup.policy": "delete"}
    )
    report = await sync_topics(admin, load_topic_specs(SETTINGS), mode=TopicMode.CHECK)
    assert not report.clean
    assert len(report.missing) == 7
    assert set(admin.topics) == {"tf.audit"}
    assert Drift(topic="tf.audit", key="retention.ms", want=str(90 * DAY_MS), have="1000") in (
        report.drift
    )
    unset = {d.key for d in report.drift if d.have is None}
    assert unset == {"max.message.bytes", "min.insync.replicas"}
    assert report.as_dict()["drift"][0] == {
        "topic": "tf.audit",
        "key": "max.message.bytes",
        "want": "1048576",
        "have": None,
        "alterable": True,
    }


async def test_create_leaves_drift_in_place_and_reports_it() -> None:
    admin = MemoryTopicAdmin()
    specs = load_topic_specs(SETTINGS)
    await sync_topics(admin, specs, mode=TopicMode.CREATE)
    admin.topics["tf.dlq"] = TopicState(
        name="tf.dlq",
        partitions=4,
        config={**admin.topics["tf.dlq"].config, "cleanup.policy": "compact"},
    )
    report = await sync_topics(admin, specs, mode=TopicMode.CREATE)
    assert report.drift == [
        Drift(topic="tf.dlq", key="cleanup.policy", want="delete", have="compact")
    ]
    assert admin.topics["tf.dlq"].config["cleanup.policy"] == "compact"


async def test_apply_alters_configs_keeps_other_overrides_and_leaves_partitions() -> None:
    admin = MemoryTopicAdmin()
    admin.topics["tf.audit"] = TopicState(
        name="tf.audit",
        partitions=12,
        config={"retention.ms": "1000", "segment.ms": "3600000"},
        overrides=frozenset({"retention.ms", "segment.ms"}),
    )
    report = await sync_topics(admin, load_topic_specs(SETTINGS), mode=TopicMode.APPLY)
    audit = admin.topics["tf.audit"].config
    assert audit["retention.ms"] == str(90 * DAY_MS)
    assert audit["segment.ms"] == "3600000"  # an operator's own override survives
    assert {d.key for d in report.altered} == {
        "retention.ms",
        "cleanup.policy",
        "max.message.bytes",
        "min.insync.replicas",
    }
    assert report.drift == [
        Drift(topic="tf.audit", key="partitions", want="4", have="12", alterable=False)
    ]
    assert len(report.created) == 7


async def test_apply_on_a_broker_without_alter_configs_fails_loudly() -> None:
    admin = MemoryTopicAdmin(alter_supported=False)
    admin.topics["tf.audit"] = TopicState(name="tf.audit", partitions=4, config={})
    with pytest.raises(TopicAdminError, match="does not support AlterConfigs"):
        await sync_topics(admin, load_topic_specs(SETTINGS), mode=TopicMode.APPLY)
