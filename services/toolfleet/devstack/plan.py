"""What ``toolfleet dev`` will run: keys, servers, policy, ports and the service commands.

:func:`build_plan` does the synchronous preparation (it starts embedded servers on the
given exit stack) and returns a :class:`DevPlan` the supervisor then executes.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from toolfleet.api.settings import ApiSettings
from toolfleet.auth.grants import ensure_grant_key
from toolfleet.auth.keys import ensure_key_pair
from toolfleet.devstack.environment import (
    ENV_PREFIX,
    child_environment,
    redact_url,
    user_settings,
    write_dev_policy,
)
from toolfleet.devstack.network import port_is_free, preferred_port
from toolfleet.devstack.processes import ServiceSpec
from toolfleet.devstack.servers import start_missing_servers
from toolfleet.settings import FleetSettings
from toolfleet.worker import DEFAULT_LAYOUT, process_name

#: Partitions per topic on the embedded dev broker (``TOOLFLEET_TOPIC_PARTITIONS`` wins).
DEV_PARTITIONS = 3

#: The API's conventional port, used when free and ``TOOLFLEET_API_PORT`` is unset.
API_PORT = 8080
_WILDCARDS = {"", "0.0.0.0", "::"}


class PlanError(Exception):
    """The configuration cannot work (a configured port is taken ...); the message says why."""


@dataclass(frozen=True, kw_only=True)
class DevPlan:
    """A dev fleet, ready to start."""

    home: Path
    """``$TOOLFLEET_HOME``, absolute."""
    settings: FleetSettings
    """The fleet's settings (what ``bootstrap`` uses)."""
    fleet_env: dict[str, str]
    """Every ``TOOLFLEET_*`` setting of the fleet: the content of ``dev.env``."""
    services: tuple[ServiceSpec, ...]
    """The workers and the API, one child process each."""
    api_url: str
    """Where clients reach the API."""
    readiness_url: str
    """Local ``/readyz`` of the API child."""


def dev_topic_settings(configured: Collection[str]) -> dict[str, str]:
    """Topic settings of a fleet on the embedded broker: ``DEV_PARTITIONS`` partitions
    unless the user set them or brought a Kafka of their own. One worker of each kind
    needs no more, and the dev broker's CPU per fetch grows with the partitions it
    names (a consumer of audit or status names every lifecycle topic's)."""
    if "kafka_bootstrap" in configured or "topic_partitions" in configured:
        return {}
    return {"TOOLFLEET_TOPIC_PARTITIONS": str(DEV_PARTITIONS)}


def toolfleet_command() -> tuple[str, ...]:
    """``<venv>/bin/toolfleet`` next to this interpreter, else ``python -m toolfleet``."""
    script = Path(sys.executable).parent / "toolfleet"
    if script.is_file() and os.access(script, os.X_OK):
        return (str(script),)
    return (sys.executable, "-m", "toolfleet")


def _signing_keys(settings: FleetSettings, home: Path) -> tuple[Path, Path]:
    private, public = settings.jwt_private_key_file, settings.jwt_public_key_file
    if private is None or public is None:
        private, public = home / "keys" / "jwt_private.pem", home / "keys" / "jwt_public.pem"
    private, public = private.expanduser().resolve(), public.expanduser().resolve()
    ensure_key_pair(private, public)
    return private, public


def _grant_key(settings: FleetSettings, home: Path) -> Path:
    """The secret policy signs execution grants with (created once, mode 600)."""
    path = (settings.grant_key_file or home / "keys" / "grant.key").expanduser().resolve()
    ensure_grant_key(path)
    return path


def _api_endpoint(api: ApiSettings) -> tuple[int, str, str]:
    """``(port, api_url, readiness_url)``: the configured port, else 8080 or a free one."""
    bind = api.api_host
    if "api_port" in api.model_fields_set:
        port = api.api_port
        if not port_is_free(port, bind or "127.0.0.1"):
            raise PlanError(f"TOOLFLEET_API_PORT={port} is in use; free it or pick another port")
    else:
        port = preferred_port(API_PORT, bind or "127.0.0.1")
    local = "127.0.0.1" if bind in _WILDCARDS else bind
    base = f"http://{local}:{port}"
    api_url = api.api_url if "api_url" in api.model_fields_set else base
    return port, api_url.rstrip("/"), f"{base}/readyz"


def build_plan(stack: contextlib.ExitStack, *, home: Path, say: Callable[[str], None]) -> DevPlan:
    """Read the settings, create keys and policy, start missing servers, pick ports."""
    settings, api = FleetSettings(), ApiSettings()
    configured = set(settings.model_fields_set) | set(api.model_fields_set)
    private, public = _signing_keys(settings, home)
    grant_key = _grant_key(settings, home)
    if settings.policy_file is None:
        policy = write_dev_policy(home)
        say(f"development policy: every tenant may call core__* ({policy})")
    else:
        policy = settings.policy_file.expanduser().resolve()
    api_port, api_url, readiness_url = _api_endpoint(api)

    servers = start_missing_servers(stack, home=home, configured=configured, say=say)
    for name, label in (("kafka_bootstrap", "Kafka"), ("redis_url", "Redis")):
        if name in configured:
            say(f"using the configured {label} at {redact_url(str(getattr(settings, name)))}")
    if "database_url" in configured:
        say(f"using the configured Postgres at {redact_url(settings.database_url)}")

    fleet = user_settings(settings)
    fleet.update(servers)
    fleet.update(dev_topic_settings(configured))
    fleet.update(
        {
            "TOOLFLEET_HOME": str(home),
            "TOOLFLEET_API_URL": api_url,
            "TOOLFLEET_API_PORT": str(api_port),
            "TOOLFLEET_JWT_PRIVATE_KEY_FILE": str(private),
            "TOOLFLEET_JWT_PUBLIC_KEY_FILE": str(public),
            "TOOLFLEET_GRANT_KEY_FILE": str(grant_key),
            "TOOLFLEET_POLICY_FILE": str(policy),
            "TOOLFLEET_TOPIC_PREFIX": settings.topic_prefix,
        }
    )
    fields = FleetSettings.model_fields
    # model_validate, not the constructor: these values are final, no env or .env reading.
    resolved = FleetSettings.model_validate(
        {
            key.removeprefix(ENV_PREFIX).lower(): value
            for key, value in fleet.items()
            if key.removeprefix(ENV_PREFIX).lower() in fields
        }
    )
    env = child_environment(fleet, configured=configured)
    command = toolfleet_command()
    services = [
        ServiceSpec(name=process_name(worker), argv=(*command, "worker", worker), env=env)
        for worker in DEFAULT_LAYOUT
    ]
    if _installed("faust"):
        # Stream analytics joins when its extra is installed: idle it costs well under
        # 1 % of a core (it writes snapshots only when something changed).
        services.append(
            ServiceSpec(name="analytics", argv=(*command, "worker", "analytics"), env=env)
        )
    # Retention too, so a long-lived dev fleet does not grow without bound: one pass of a
    # few small queries per interval.
    services.append(
        ServiceSpec(name="maintenance", argv=(*command, "worker", "maintenance"), env=env)
    )
    services.append(ServiceSpec(name="api", argv=(*command, "api"), env=env, url=api_url))
    return DevPlan(
        home=home,
        settings=resolved,
        fleet_env=fleet,
        services=tuple(services),
        api_url=api_url,
        readiness_url=readiness_url,
    )


def _installed(package: str) -> bool:
    """Whether ``package`` can be imported (``find_spec`` raises for one already imported
    without a ``__spec__``, as faust's module is)."""
    if package in sys.modules:
        return True
    try:
        return importlib.util.find_spec(package) is not None
    except ValueError:
        return True
