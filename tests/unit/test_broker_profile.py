"""Broker profiles: production Kafka by default, the dev broker's needs only when asked.

The ``kafka`` profile's clients long-poll at the broker, produce idempotently with
``acks=all`` and leave their group on stop (the integration test
``test_broker_profile_leave_group.py``); nothing of the dev stack is loaded for it.
"""

from __future__ import annotations

import ast
import asyncio
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import cast

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

import toolfleet
from toolfleet.bus.producer import EventProducer, Outbound, producer_kwargs
from toolfleet.bus.profile import KafkaProfile, PacingInput, ProfileNotGiven, open_profile
from toolfleet.bus.runtime import (
    ConsumerSpec,
    EventConsumer,
    Inbound,
    consumer_kwargs,
    pacing_input,
)
from toolfleet.devstack.broker_profile import DevBrokerProfile, DevBrokerSettings
from toolfleet.devstack.environment import child_environment, user_settings
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.unit

KAFKA = FleetSettings(broker_profile="kafka")
DEV = FleetSettings(broker_profile="dev")
SPEC = ConsumerSpec(service="svc", source="/toolfleet/svc", group_id="g", topics=["p.t"])


def test_kafka_is_the_default_profile_and_its_defaults_are_production_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TOOLFLEET_BROKER_PROFILE")  # the tests' dev profile (conftest)
    bare = FleetSettings(_env_file=None)
    assert bare.broker_profile == "kafka"
    assert (bare.fetch_max_wait_ms, bare.enable_idempotence) == (500, True)
    assert (DEV.fetch_max_wait_ms, DEV.enable_idempotence) == (5, False)


def test_what_a_user_sets_wins_over_the_profile_and_defaults_stay_unset() -> None:
    chosen = FleetSettings(broker_profile="kafka", fetch_max_wait_ms=200, enable_idempotence=False)
    assert (chosen.fetch_max_wait_ms, chosen.enable_idempotence) == (200, False)
    # A default of the profile is not a value the user set: dev.env and child processes
    # that carry the set values only must not freeze the kafka profile's 500 ms.
    set_here = KAFKA.model_dump(exclude_unset=True)
    assert set_here["broker_profile"] == "kafka"
    assert "fetch_max_wait_ms" not in set_here
    assert "enable_idempotence" not in set_here


async def test_a_kafka_consumer_long_polls_at_the_broker_and_never_waits_itself() -> None:
    profile = KafkaProfile(KAFKA)
    for spec, held_ms in (
        (SPEC, 500),
        (replace(SPEC, observer=True), 500),  # observers too
        (replace(SPEC, fetch_max_wait_ms=50), 50),
    ):
        pacing = profile.pacing(pacing_input(spec))
        kwargs = consumer_kwargs(KAFKA, spec, pacing)
        assert kwargs["fetch_max_wait_ms"] == held_ms
        assert not pacing.wants_rest(busy=False)  # no doorbell: it simply fetches again
        AIOKafkaConsumer(*spec.topics, **kwargs)  # what aiokafka accepts, not started


async def test_a_kafka_producer_is_idempotent_with_acks_all() -> None:
    kwargs = producer_kwargs(KAFKA)
    assert (kwargs["acks"], kwargs["enable_idempotence"]) == ("all", True)
    AIOKafkaProducer(**kwargs)
    EventProducer(KAFKA)  # the fleet's producer builds with them
    with pytest.raises(ValueError, match="acks=1 not supported"):
        AIOKafkaProducer(**{**kwargs, "acks": 1})  # idempotence is only with acks=all
    assert producer_kwargs(DEV)["enable_idempotence"] is False  # the dev broker lacks it
    assert producer_kwargs(DEV)["acks"] == "all"


def test_the_start_line_says_what_the_profile_does() -> None:
    assert KafkaProfile(KAFKA).summary() == (
        "broker profile: kafka (long polls 500 ms, idempotent producer acks=all, "
        "LeaveGroup on stop)"
    )
    plain = FleetSettings(broker_profile="kafka", enable_idempotence=False)
    assert "not idempotent (TOOLFLEET_ENABLE_IDEMPOTENCE=false)" in KafkaProfile(plain).summary()
    dev = DevBrokerProfile(DevBrokerSettings(broker_profile="dev")).summary()
    assert dev == (
        "broker profile: dev (fetches held 1 ms at the broker, 4 ms more in the client, "
        "up to 100 ms at the broker when known to find records, "
        "no doorbell, producer acks=all, no LeaveGroup on stop)"
    )
    off = DevBrokerSettings(broker_profile="dev", fetch_found_wait_ms=0)
    assert "known to find" not in DevBrokerProfile(off).summary()


async def test_a_consumer_under_the_dev_profile_refuses_to_run_without_its_implementation() -> None:
    async def handler(_: Inbound) -> Sequence[Outbound]:
        return []

    consumer = EventConsumer(
        SPEC,
        handler,
        settings=DEV,
        producer=cast(EventProducer, None),
        processed=None,
        dlq_topic="dlq",
    )
    with pytest.raises(ProfileNotGiven, match="TOOLFLEET_BROKER_PROFILE=dev"):
        await consumer.run(asyncio.Event())  # before any connection: no silent kafka


async def test_the_dev_profile_is_the_dev_stacks_plugin_loaded_when_named() -> None:
    profile = open_profile(DEV, doorbell=False)  # through the toolfleet.broker_profiles entry point
    assert isinstance(profile, DevBrokerProfile)
    await profile.aclose()
    unknown = DEV.model_copy(update={"broker_profile": "elsewhere"})
    with pytest.raises(ProfileNotGiven, match="no such profile is installed"):
        open_profile(unknown)


def test_the_dev_profile_pacing_follows_its_own_settings() -> None:
    pacing = DevBrokerProfile(DEV).pacing(PacingInput(topics=frozenset({"t"}), observer=True))
    assert pacing.broker_wait_ms == 1  # observers: 50 ms, 1 of them at the broker


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_bus_never_imports_the_dev_stack() -> None:
    bus = Path(toolfleet.__file__).parent / "bus"
    crossings = sorted(
        f"{path.name} imports {module}"
        for path in bus.rglob("*.py")
        for module in imports_of(path)
        if module.startswith("toolfleet.devstack")
    )
    assert crossings == []


def test_the_kafka_profile_of_workers_clients_and_tails_loads_nothing_of_the_dev_stack() -> None:
    script = (
        "import sys\n"
        "from toolfleet.settings import FleetSettings\n"
        "import toolfleet.worker, toolfleet.client.kafka, toolfleet.cli.audit\n"
        "from toolfleet.bus.profile import open_profile\n"
        "s = FleetSettings(_env_file=None)\n"
        "names = {open_profile(s).name, open_profile(s, doorbell=False).name}\n"
        "assert names == {'kafka'}, names\n"
        "print(sorted(m for m in sys.modules if m.startswith('toolfleet.devstack')))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_toolfleet_dev_gives_its_fleet_the_dev_profile_unless_the_user_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TOOLFLEET_BROKER_PROFILE")
    fleet = user_settings(FleetSettings(_env_file=None))  # what dev.env and children get
    assert fleet["TOOLFLEET_BROKER_PROFILE"] == "dev"
    assert "TOOLFLEET_FETCH_MAX_WAIT_MS" not in fleet  # so the dev profile's 5 ms applies
    child = child_environment(fleet, configured=set(), base={})
    assert child["TOOLFLEET_BROKER_PROFILE"] == "dev"
    monkeypatch.setenv("TOOLFLEET_BROKER_PROFILE", "kafka")  # a user's own Kafka
    assert user_settings(FleetSettings(_env_file=None))["TOOLFLEET_BROKER_PROFILE"] == "kafka"


def test_the_analytics_app_times_its_group_by_profile(tmp_path: Path) -> None:
    pytest.importorskip("faust")
    from toolfleet.analytics.app import faust_settings
    from toolfleet.analytics.settings import AnalyticsSettings

    kafka = faust_settings(
        AnalyticsSettings(broker_profile="kafka", session_timeout_ms=30_000), tmp_path
    )
    dev = faust_settings(AnalyticsSettings(broker_profile="dev"), tmp_path)
    timing = ("broker_session_timeout", "broker_rebalance_timeout", "broker_heartbeat_interval")
    assert [kafka[k] for k in timing] == [30.0, 30.0, 10.0]  # the fleet's session, like workers
    assert [dev[k] for k in timing] == [10.0, 10.0, 1.0]  # a dev fleet rejoins at once
    for conf in (kafka, dev):
        assert (conf["processing_guarantee"], conf["producer_acks"]) == ("at_least_once", -1)
