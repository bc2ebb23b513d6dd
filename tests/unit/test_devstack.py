"""``toolfleet dev`` building blocks: env files, backoff, supervision, infra files."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.eventually import eventually
from toolfleet.devstack.console import DevConsole
from toolfleet.devstack.environment import (
    DEV_POLICY,
    child_environment,
    parse_env_file,
    redact_url,
    render_env_file,
)
from toolfleet.devstack.processes import (
    RestartPolicy,
    ServiceSpec,
    SupervisedProcess,
    describe_exit,
    stop_all,
)
from toolfleet.events.types import TopicName
from toolfleet.policy.documents import PolicyDocument, load_policy, matches_any

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_env_file_round_trips_values_a_shell_would_mangle() -> None:
    values = {
        "TOOLFLEET_DATABASE_URL": "postgresql://postgres:@/toolfleet?host=/tmp/a b/pgdata",
        "TOOLFLEET_TOPIC_PREFIX": "toolfleet.",
        "TOOLFLEET_TOOL_MODULES": "",
        "TOOLFLEET_X": "it's $HOME",
    }
    text = render_env_file(values)
    assert all(line.startswith(("#", "export TOOLFLEET_")) for line in text.splitlines())
    assert parse_env_file(text) == values


def test_children_log_for_humans_unless_the_user_chose() -> None:
    fleet = {"TOOLFLEET_REDIS_URL": "redis://x:1/0"}
    env = child_environment(fleet, configured=set(), base={"PATH": "/bin"})
    assert env["TOOLFLEET_LOG_FORMAT"] == "console"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["PATH"] == "/bin"
    chosen = child_environment(
        fleet, configured={"log_format"}, base={"TOOLFLEET_LOG_FORMAT": "json"}
    )
    assert chosen["TOOLFLEET_LOG_FORMAT"] == "json"


def test_redact_url_hides_only_the_password() -> None:
    assert redact_url("postgresql://u:secret@db:5432/x") == "postgresql://u:***@db:5432/x"
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_restart_delay_doubles_up_to_the_cap() -> None:
    policy = RestartPolicy(initial_delay_s=1, max_delay_s=8)
    assert [policy.delay(n) for n in range(1, 7)] == [1, 2, 4, 8, 8, 8]


def test_describe_exit_names_signals() -> None:
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exit code 3"


def test_dev_policy_allows_core_tools_for_any_tenant() -> None:
    policy = PolicyDocument.model_validate(DEV_POLICY).for_tenant("anyone")
    assert policy is not None
    assert matches_any("core__echo", policy.allow_tools)
    assert not matches_any("acme__drop_database", policy.allow_tools)


def test_production_policy_example_denies_unknown_tenants() -> None:
    document = load_policy(ROOT / "infra" / "policy.example.yaml")
    assert document.for_tenant("tenant_unknown") is None
    acme = document.for_tenant("tenant_acme")
    assert acme is not None
    assert matches_any("acme__drop_users", acme.deny_tools)


def test_topics_yaml_lists_exactly_the_contract_topics() -> None:
    doc = yaml.safe_load((ROOT / "infra" / "topics.yaml").read_text())
    assert set(doc["topics"]) == {name.value for name in TopicName}
    assert doc["defaults"]["partitions"] == 12
    assert doc["defaults"]["key"] == "tenant_id"
    for name, spec in doc["topics"].items():
        config = {**doc["defaults"]["config"], **spec.get("config", {})}
        assert config["cleanup.policy"] == "delete", name  # compaction by tenant loses events
        assert int(config["retention.ms"]) > 0, name
        assert spec["description"], name


def _spec(code: str) -> ServiceSpec:
    return ServiceSpec(name="child", argv=(sys.executable, "-c", code), env={"PATH": "/bin"})


async def test_a_dying_child_is_restarted_and_its_output_logged(tmp_path: Path) -> None:
    console = DevConsole(tmp_path, stream=None)
    process = SupervisedProcess(
        _spec("print('hello from the child'); raise SystemExit(3)"),
        console=console,
        restart=RestartPolicy(initial_delay_s=0.01, max_delay_s=0.05),
    )
    task = asyncio.create_task(process.run())

    async def restarted_twice() -> bool:
        return process.restarts >= 2

    await eventually(restarted_twice, timeout=30)
    assert await stop_all([process], [task], grace_s=5) == []
    console.close()
    assert len(set(process.pids)) >= 3
    assert "hello from the child" in (tmp_path / "child.log").read_text()
    assert "child died: exit code 3" in (tmp_path / "dev.log").read_text()


async def test_stop_all_terminates_then_kills_stragglers(tmp_path: Path) -> None:
    console = DevConsole(tmp_path, stream=None)
    polite = SupervisedProcess(_spec("import time; time.sleep(60)"), console=console)
    stubborn = SupervisedProcess(
        ServiceSpec(
            name="stubborn",
            argv=(
                sys.executable,
                "-c",
                "import signal, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "print('ready', flush=True)\n"
                "time.sleep(60)",
            ),
        ),
        console=console,
    )
    tasks = [asyncio.create_task(p.run()) for p in (polite, stubborn)]

    async def both_running() -> bool:
        log = tmp_path / "stubborn.log"
        return polite.running and log.exists() and "ready" in log.read_text()

    await eventually(both_running, timeout=30)
    assert await stop_all([polite, stubborn], tasks, grace_s=1) == ["stubborn"]
    assert not polite.running
    assert not stubborn.running
    assert all(task.done() for task in tasks)
    console.close()


def test_the_embedded_broker_gets_few_partitions_unless_the_user_chose() -> None:
    from toolfleet.devstack.plan import DEV_PARTITIONS, dev_topic_settings

    assert dev_topic_settings(set()) == {"TOOLFLEET_TOPIC_PARTITIONS": str(DEV_PARTITIONS)}
    assert dev_topic_settings({"topic_partitions"}) == {}
    assert dev_topic_settings({"kafka_bootstrap"}) == {}  # a real Kafka: production sizes
