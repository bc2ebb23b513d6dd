"""The settings a dev fleet shares: the development policy, ``dev.env`` and child envs.

``dev.env`` holds one ``export TOOLFLEET_X=value`` line per setting the fleet uses, with
absolute paths, so ``source .toolfleet/dev.env`` puts any shell on the same fleet. The
``export`` keyword is what makes ``source`` hand the values to the commands run next;
dotenv readers (python-dotenv, Docker Compose ``env_file``) accept it too.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from toolfleet.settings import FleetSettings

ENV_PREFIX = "TOOLFLEET_"

#: What ``toolfleet dev`` allows when ``TOOLFLEET_POLICY_FILE`` is unset.
DEV_POLICY: dict[str, Any] = {"tenants": {"*": {"allow_tools": ["core__*"]}}}

#: Always written to ``dev.env``, whatever the user set (the contract names them).
REQUIRED_KEYS = (
    "TOOLFLEET_HOME",
    "TOOLFLEET_KAFKA_BOOTSTRAP",
    "TOOLFLEET_REDIS_URL",
    "TOOLFLEET_DATABASE_URL",
    "TOOLFLEET_API_URL",
    "TOOLFLEET_API_PORT",
    "TOOLFLEET_JWT_PRIVATE_KEY_FILE",
    "TOOLFLEET_JWT_PUBLIC_KEY_FILE",
    "TOOLFLEET_GRANT_KEY_FILE",
    "TOOLFLEET_POLICY_FILE",
    "TOOLFLEET_TOPIC_PREFIX",
)


def write_dev_policy(home: Path) -> Path:
    """Write ``home/dev-policy.yaml`` (``core__*`` for every tenant); return its path."""
    path = home / "dev-policy.yaml"
    text = (
        "# Written by `toolfleet dev`: every tenant may call the built-in core__* tools.\n"
        "# Set TOOLFLEET_POLICY_FILE to use another policy; production denies by default.\n"
        + yaml.safe_dump(DEV_POLICY, sort_keys=False)
    )
    write_atomically(path, text)
    return path


def setting_value(value: object) -> str:
    """A settings value as an environment variable would spell it."""
    if isinstance(value, Path):
        return str(value.expanduser().resolve())
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


#: The broker profile of a dev fleet, unless the user names another: the embedded
#: broker's (:mod:`toolfleet.devstack.broker_profile`).
DEV_BROKER_PROFILE = "dev"


def user_settings(settings: FleetSettings) -> dict[str, str]:
    """``TOOLFLEET_*`` values the user set (environment, ``.env``), normalised, and the
    dev broker profile (``TOOLFLEET_BROKER_PROFILE=dev``) unless the user set one: every
    child and ``dev.env`` get it."""
    values = {
        f"{ENV_PREFIX}{name.upper()}": setting_value(value)
        for name, value in settings.model_dump(exclude_unset=True).items()
        if value is not None
    }
    # Service knobs (TOOLFLEET_CHECKPOINT_TTL_S ...) are not FleetSettings fields.
    for name, value in os.environ.items():
        if name.startswith(ENV_PREFIX):
            values.setdefault(name, value)
    values.setdefault(f"{ENV_PREFIX}BROKER_PROFILE", DEV_BROKER_PROFILE)
    return values


def render_env_file(values: Mapping[str, str]) -> str:
    """``export KEY=value`` lines, shell-quoted where needed, sorted by key."""
    lines = ["# Written by `toolfleet dev` once the fleet was up. Use: source <this file>"]
    lines += [f"export {key}={shlex.quote(values[key])}" for key in sorted(values)]
    return "\n".join(lines) + "\n"


def parse_env_file(text: str) -> dict[str, str]:
    """Read back what :func:`render_env_file` wrote (``KEY=value``, optional ``export``)."""
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        line = line.removeprefix("export ").lstrip()
        key, sep, rest = line.partition("=")
        if sep:
            words = shlex.split(rest)
            values[key.strip()] = words[0] if words else ""
    return values


def write_atomically(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write a file so readers see the old content or the new, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    partial.chmod(mode)
    partial.replace(path)


def child_environment(
    fleet: Mapping[str, str], *, configured: set[str], base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of every child: ``base`` (the supervisor's) plus the fleet values.

    Children log in ``console`` format unless the user chose a format, and unbuffered, so
    their lines reach the terminal as they happen.
    """
    env = dict(os.environ if base is None else base)
    env.update(fleet)
    if "log_format" not in configured:
        env["TOOLFLEET_LOG_FORMAT"] = "console"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, fit for the console."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))
