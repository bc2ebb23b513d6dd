"""The image and docker-compose.yml, checked offline (no Docker engine needed).

docker-compose.yml is the production-shaped stack: every service it runs must be a real
``toolfleet`` command of the image, every worker the README documents must have a
service, and nothing may bend the runtime for the dev broker (the ``kafka`` broker
profile is the default). ``docker compose config`` runs too where the plugin exists.

The helpers here (the CLI check, the settings and dev-profile variables) serve
``test_k8s_manifests.py`` as well.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.core
import typer.main
import yaml

from toolfleet.cli.extras import EXTRAS_OF_COMMAND
from toolfleet.cli.fleet import WorkerName
from toolfleet.cli.main import app
from toolfleet.config_doc import SETTINGS_CLASSES
from toolfleet.events.types import check_pool_name
from toolfleet.observability.health import READINESS_PATH
from toolfleet.worker import (
    AUXILIARY,
    DEFAULT_LAYOUT,
    KEYED,
    SERVICES,
    process_name,
    worker_services,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

#: Every worker the README documents: the pipeline, the auxiliary ones, analytics.
DOCUMENTED_WORKERS: tuple[str, ...] = (*SERVICES, *AUXILIARY, WorkerName.ANALYTICS.value)

#: Knobs that exist for the embedded dev broker (or that the `kafka` profile sets):
#: a production stack sets none of them.
DEV_PROFILE_VARIABLES = frozenset(
    {
        "TOOLFLEET_FETCH_MAX_WAIT_MS",
        "TOOLFLEET_FETCH_BROKER_WAIT_MS",
        "TOOLFLEET_FETCH_DOORBELL",
        "TOOLFLEET_IDLE_AFTER_MS",
        "TOOLFLEET_IDLE_FETCH_INTERVAL_MS",
        "TOOLFLEET_ENABLE_IDEMPOTENCE",
        "TOOLFLEET_KAFKA_LEAVE_GROUP",
        "TOOLFLEET_TEST_MODE",
    }
)

#: Services that verify capability tokens (the public key, or a JWKS).
VERIFY_TOKENS = frozenset({"policy", "api"})

#: Any one of these gives a service the keys that verify capability tokens.
TOKEN_KEY_VARIABLES = (
    "TOOLFLEET_JWT_PUBLIC_KEY_FILE",
    "TOOLFLEET_JWKS_FILE",
    "TOOLFLEET_JWKS_URL",
)


def settings_variables() -> frozenset[str]:
    """Every ``TOOLFLEET_*`` variable a settings class of the fleet reads."""
    import importlib

    names: set[str] = set()
    for module, name in SETTINGS_CLASSES:
        cls = getattr(importlib.import_module(module), name)
        names.update(f"TOOLFLEET_{field.upper()}" for field in cls.model_fields)
    return frozenset(names)


def env_problems(where: str, env: Mapping[str, object]) -> list[str]:
    """What is wrong with the ``TOOLFLEET_*`` variables ``env`` sets for production."""
    known = settings_variables()
    problems: list[str] = []
    for name in env:
        if not name.startswith("TOOLFLEET_"):
            continue
        if name in DEV_PROFILE_VARIABLES or "DOORBELL" in name:
            problems.append(
                f"{where}: sets {name}, a dev-broker knob (the kafka profile covers it)"
            )
        elif name not in known:
            problems.append(f"{where}: sets {name}, which no settings class reads")
    if str(env.get("TOOLFLEET_BROKER_PROFILE", "kafka")) != "kafka":
        problems.append(f"{where}: TOOLFLEET_BROKER_PROFILE is not the production profile")
    return problems


@cache
def _cli() -> Any:
    """The CLI's command tree (typer builds it anew on every call, in 0.1 s)."""
    return typer.main.get_command(app)


def cli_problem(argv: Sequence[str]) -> str | None:
    """Why ``toolfleet *argv`` is not a command the CLI accepts, or None if it is.

    The argument list goes through the CLI's own parser (typer's: options, arguments
    and their types), down the command groups, without running anything; a worker name
    must be one ``toolfleet worker`` runs.
    """
    command = _cli()
    ctx = typer.Context(command, info_name="toolfleet")
    args = list(argv)
    path: list[str] = []
    while isinstance(command, typer.core.TyperGroup):
        if not args or args[0].startswith("-"):
            return f"toolfleet {' '.join(argv)}: no command after {' '.join(path) or 'toolfleet'}"
        name, args = args[0], args[1:]
        sub = command.get_command(ctx, name)
        if sub is None:
            return f"toolfleet {' '.join(argv)}: no command {name!r}"
        path.append(name)
        parent, command = ctx, sub
        ctx = typer.Context(command, info_name=name, parent=parent)
    try:
        leaf = command.make_context(path[-1], args, parent=ctx.parent)
    except typer.TyperException as exc:  # the parser's usage errors
        return f"toolfleet {' '.join(argv)}: {exc}"
    if path == ["worker"]:
        name = str(leaf.params["name"])
        services: tuple[str, ...] = (name,)
        try:
            if name != WorkerName.ANALYTICS.value:
                services = worker_services(name)
            pools = [check_pool_name(pool) for pool in leaf.params.get("pool") or ()]
        except ValueError as exc:
            return f"toolfleet {' '.join(argv)}: {exc}"
        if pools and WorkerName.EXECUTOR.value not in services:
            return f"toolfleet {' '.join(argv)}: only an executor serves pools"
    return None


def workers_of(argv: Sequence[str]) -> tuple[str, ...]:
    """The workers ``toolfleet *argv`` runs (``worker a+b`` runs two); none for others."""
    if len(argv) >= 2 and argv[0] == "worker":
        return tuple(argv[1].split("+"))
    return ()


def needs_grant_key(argv: Sequence[str]) -> bool:
    return list(argv[:1]) == ["api"] or any(w in KEYED for w in workers_of(argv))


def verifies_tokens(argv: Sequence[str]) -> bool:
    return list(argv[:1]) == ["api"] or any(w in VERIFY_TOKENS for w in workers_of(argv))


def extras_needed(argv: Sequence[str]) -> set[str]:
    """The install extras ``toolfleet *argv`` needs (toolfleet.cli.extras, plus analytics)."""
    needed = set(EXTRAS_OF_COMMAND.get(argv[0], ()))
    if WorkerName.ANALYTICS.value in workers_of(argv):
        needed.add("analytics")
    return needed


# --- docker-compose.yml -----------------------------------------------------------------


def load_compose(text: str | None = None) -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text() if text is None else text)
    assert isinstance(data, dict)
    return data


def toolfleet_services(compose: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the toolfleet image."""
    return {
        name: service
        for name, service in compose["services"].items()
        if str(service.get("image", "")).startswith("toolfleet:")
    }


def mount_targets(service: Mapping[str, Any]) -> list[str]:
    targets = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            targets.append(volume.split(":")[1])
        else:
            targets.append(str(volume["target"]))
    return targets


def seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text)
    assert match, text
    return float(match[1]) * {"ms": 0.001, "s": 1, "m": 60}[match[2]]


def compose_problems(compose: Mapping[str, Any]) -> list[str]:
    """Everything the production stack must get right that can be read off the file."""
    problems: list[str] = []
    services = toolfleet_services(compose)
    run: set[str] = set()
    for name, service in services.items():
        argv = [str(a) for a in service.get("command", [])]
        problem = cli_problem(argv)
        if problem:
            problems.append(f"{name}: {problem}")
            continue
        run.update(workers_of(argv))
        env = service.get("environment", {})
        problems += env_problems(name, env)
        for var in ("TOOLFLEET_KAFKA_BOOTSTRAP", "TOOLFLEET_REDIS_URL", "TOOLFLEET_DATABASE_URL"):
            if not env.get(var):
                problems.append(f"{name}: {var} is not set")
        if needs_grant_key(argv) and not env.get("TOOLFLEET_GRANT_KEY_FILE"):
            problems.append(f"{name}: refuses to start without TOOLFLEET_GRANT_KEY_FILE")
        if verifies_tokens(argv) and not any(env.get(v) for v in TOKEN_KEY_VARIABLES):
            problems.append(f"{name}: verifies tokens but has no public key or JWKS")
        targets = mount_targets(service)
        for var, value in env.items():
            if (
                var.endswith("_FILE")
                and value
                and not any(
                    str(value).startswith(f"{t.rstrip('/')}/") or str(value) == t for t in targets
                )
            ):
                problems.append(f"{name}: {var}={value} is in no mounted volume")
        if service.get("restart") == "no":
            continue  # one-shot (init): no healthcheck, nothing to keep alive
        test = service.get("healthcheck", {}).get("test")
        if not test:
            problems.append(f"{name}: no healthcheck")
        if workers_of(argv):
            port = env.get("TOOLFLEET_METRICS_PORT")
            command = " ".join(map(str, test or []))
            if not port or f"127.0.0.1:{port}/" not in command:
                problems.append(f"{name}: its healthcheck does not read TOOLFLEET_METRICS_PORT")
            elif (
                workers_of(argv) != ("analytics",)
                and f"127.0.0.1:{port}{READINESS_PATH}" not in command
            ):
                # The analytics app serves its metrics alone; every other worker says
                # whether its consumers are in their groups, which its metrics do not.
                problems.append(f"{name}: its healthcheck does not read {READINESS_PATH}")
            grace = seconds(str(service.get("stop_grace_period", "10s")))
            if grace <= float(env.get("TOOLFLEET_DRAIN_TIMEOUT_S", 30.0)):
                problems.append(f"{name}: stop_grace_period is not above the drain timeout")
    for worker in DOCUMENTED_WORKERS:
        if worker not in run:
            problems.append(f"no service runs `toolfleet worker {worker}`")
    for name, service in compose["services"].items():
        if name not in services and not service.get("healthcheck", {}).get("test"):
            problems.append(f"{name}: no healthcheck")
    problems += kafka_problems(compose["services"].get("kafka", {}), services)
    problems += redis_problems(compose["services"].get("redis", {}))
    if "postgres" not in compose["services"]:
        problems.append("no postgres service")
    return problems


def kafka_problems(kafka: Mapping[str, Any], services: Mapping[str, Any]) -> list[str]:
    """Apache Kafka in KRaft mode, able to serve the idempotent producer with acks=all."""
    env = {k: str(v) for k, v in kafka.get("environment", {}).items()}
    if not str(kafka.get("image", "")).startswith("apache/kafka:"):
        return ["kafka: not the Apache Kafka image"]
    problems: list[str] = []
    if "controller" not in env.get("KAFKA_PROCESS_ROLES", "") or any("ZOOKEEPER" in k for k in env):
        problems.append("kafka: not a KRaft broker")
    brokers = len(env.get("KAFKA_CONTROLLER_QUORUM_VOTERS", "").split(","))
    # The idempotent producer needs the transaction state log, which needs this many
    # live replicas; offsets and every topic toolfleet creates the same.
    for var in (
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_MIN_INSYNC_REPLICAS",
    ):
        if int(env.get(var, "3")) > brokers:
            problems.append(f"kafka: {var} is above the {brokers} broker(s) of this stack")
    for name, service in services.items():
        replication = int(service.get("environment", {}).get("TOOLFLEET_TOPIC_REPLICATION", 1))
        if replication > brokers:
            problems.append(f"{name}: TOOLFLEET_TOPIC_REPLICATION is above the brokers")
    return problems


def redis_problems(redis: Mapping[str, Any]) -> list[str]:
    command = [str(a) for a in redis.get("command", [])]
    pairs = dict(zip(command[1::2], command[2::2], strict=False))
    if pairs.get("--appendonly") != "yes":
        return ["redis: persistence is off (--appendonly yes)"]
    return []


def dockerfile_extras(text: str | None = None) -> set[str]:
    text = DOCKERFILE.read_text() if text is None else text
    found = re.findall(r"pip install '\.\[([a-z,]+)\]'", text)
    assert len(found) == 1, "the Dockerfile installs the project once, with its extras"
    return set(found[0].split(","))


# --- tests --------------------------------------------------------------------------------


def test_compose_runs_every_worker_in_production_shape() -> None:
    assert compose_problems(load_compose()) == []


def test_compose_runs_the_default_layout() -> None:
    """One service per process of the default layout, named as layouts name it: audit and
    status in one ``observers`` service, so each lifecycle record is read once."""
    commands = {
        name: [str(a) for a in service.get("command", [])]
        for name, service in toolfleet_services(load_compose()).items()
    }
    for worker in DEFAULT_LAYOUT:
        assert commands.get(process_name(worker)) == ["worker", worker], commands
    alone = [
        name for name, argv in commands.items() if workers_of(argv) in {("audit",), ("status",)}
    ]
    assert alone == [], "audit and status run in one process by default"


def split_compose() -> dict[str, Any]:
    """docker-compose.yml in the split layout, as the comment beside ``observers`` gives
    it: its ``audit`` and ``status`` services in place of ``observers``."""
    text = COMPOSE.read_text()
    services = re.findall(r"^  #   ((?:audit|status): \{.*\})$", text, flags=re.MULTILINE)
    assert len(services) == 2, "the comment beside observers shows the two split services"
    text = text.replace(
        "\n  observers:\n", "".join(f"\n  {s}" for s in services) + "\n  observers:\n"
    )
    compose = load_compose(text)
    del compose["services"]["observers"]
    return compose


def test_the_split_layout_is_a_production_stack_too() -> None:
    compose = split_compose()
    assert {name: compose["services"][name]["command"] for name in ("audit", "status")} == {
        "audit": ["worker", "audit"],
        "status": ["worker", "status"],
    }
    assert compose_problems(compose) == []
    del compose["services"]["status"]
    assert "no service runs `toolfleet worker status`" in compose_problems(compose)


def test_the_image_has_every_extra_its_commands_need_and_no_dev_stack() -> None:
    extras = dockerfile_extras()
    services = toolfleet_services(load_compose())
    needed = set().union(*(extras_needed(s["command"]) for s in services.values()))
    assert needed <= extras, f"the image lacks {sorted(needed - extras)}"
    assert "analytics" in extras  # `toolfleet worker analytics` (README: Analytics)
    assert not extras & {"devstack", "all", "dev"}


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        pytest.param(
            lambda c: c["services"]["observers"].update(command=["worker", "audit+stauts"]),
            "observers: toolfleet worker audit+stauts",
            id="a-misspelt-worker",
        ),
        pytest.param(
            lambda c: c["services"]["api"].update(command=["api", "--portt", "1"]),
            "No such option",
            id="an-unknown-option",
        ),
        pytest.param(
            lambda c: c["services"].pop("analytics"),
            "no service runs `toolfleet worker analytics`",
            id="no-analytics",
        ),
        pytest.param(
            lambda c: c["services"]["executor"]["environment"].update(
                TOOLFLEET_FETCH_BROKER_WAIT_MS="500"
            ),
            "executor: sets TOOLFLEET_FETCH_BROKER_WAIT_MS, a dev-broker knob",
            id="a-dev-broker-knob",
        ),
        pytest.param(
            lambda c: c["services"]["policy"]["environment"].update(TOOLFLEET_BROKER_PROFILE="dev"),
            "policy: TOOLFLEET_BROKER_PROFILE is not the production profile",
            id="the-dev-profile",
        ),
        pytest.param(
            lambda c: c["services"]["observers"]["environment"].pop("TOOLFLEET_GRANT_KEY_FILE"),
            "observers: refuses to start without TOOLFLEET_GRANT_KEY_FILE",
            id="no-grant-key",
        ),
        pytest.param(
            lambda c: c["services"]["validator"].pop("healthcheck"),
            "validator: no healthcheck",
            id="no-healthcheck",
        ),
        pytest.param(
            lambda c: c["services"]["observers"]["healthcheck"].update(
                test=[
                    "CMD",
                    "python",
                    "-c",
                    "import urllib.request; "
                    "urllib.request.urlopen('http://127.0.0.1:9100/metrics', timeout=3)",
                ]
            ),
            "observers: its healthcheck does not read /readyz",
            id="healthcheck-shows-only-a-process",
        ),
        pytest.param(
            lambda c: c["services"]["analytics"]["healthcheck"].update(
                test=[
                    "CMD",
                    "python",
                    "-c",
                    "import urllib.request; "
                    "urllib.request.urlopen('http://127.0.0.1:9200/metrics', timeout=3)",
                ]
            ),
            "analytics: its healthcheck does not read TOOLFLEET_METRICS_PORT",
            id="analytics-healthcheck-on-the-wrong-port",
        ),
        pytest.param(
            lambda c: c["services"]["kafka"]["environment"].update(
                KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR=3
            ),
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR is above",
            id="no-idempotent-producer",
        ),
        pytest.param(
            lambda c: c["services"]["redis"].update(command=["redis-server"]),
            "redis: persistence is off",
            id="redis-without-aof",
        ),
    ],
)
def test_compose_check_catches_a_planted_error(edit: Any, expected: str) -> None:
    compose = load_compose()
    # Anchors are shared dicts once loaded: give each service its own copy first.
    for name, service in compose["services"].items():
        compose["services"][name] = yaml.safe_load(yaml.safe_dump(service))
    edit(compose)
    problems = compose_problems(compose)
    assert any(expected in p for p in problems), problems


def test_the_image_check_catches_a_missing_extra() -> None:
    text = DOCKERFILE.read_text().replace("'.[fleet,api,analytics]'", "'.[fleet,api]'")
    assert "analytics" not in dockerfile_extras(text)
