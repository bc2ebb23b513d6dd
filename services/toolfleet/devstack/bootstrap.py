"""Prepare a fleet's shared state: database, schema, topics and tool registry.

``toolfleet init`` (the one-shot ``init`` service of ``docker-compose.yml``) and
``toolfleet dev`` both call :func:`bootstrap`. Every step is idempotent, so running it
again, or from several processes at once, is safe.
"""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import unquote, urlsplit

import asyncpg

from toolfleet.bus.admin import sync_fleet_topics
from toolfleet.bus.topics import TopicMode, TopicReport
from toolfleet.executor.registration import register_catalog
from toolfleet.registry.catalog import discover
from toolfleet.settings import FleetSettings
from toolfleet.storage.postgres import create_pool, dsn_with_database, migrate

log = logging.getLogger(__name__)

#: The maintenance database every Postgres server has; ``CREATE DATABASE`` runs there.
MAINTENANCE_DATABASE = "postgres"


def database_name(dsn: str) -> str | None:
    """The database a DSN names in its path, or ``None`` when it names none."""
    name = unquote(urlsplit(dsn).path.lstrip("/"))
    return name or None


def quote_identifier(name: str) -> str:
    """``name`` as a Postgres quoted identifier (``CREATE DATABASE`` takes no parameters)."""
    return '"' + name.replace('"', '""') + '"'


async def ensure_database(dsn: str) -> bool:
    """Create the database ``dsn`` names unless it exists; return True if it was created.

    Connects to the database itself first, so a role without rights on the maintenance
    database works as long as its database exists.
    """
    name = database_name(dsn)
    try:
        conn = await asyncpg.connect(dsn)
    except asyncpg.InvalidCatalogNameError:
        if name is None:
            raise
    else:
        await conn.close()
        return False
    admin = await asyncpg.connect(dsn_with_database(dsn, MAINTENANCE_DATABASE))
    try:
        await admin.execute(f"CREATE DATABASE {quote_identifier(name)}")
    except asyncpg.DuplicateDatabaseError:
        return False  # another process created it in the meantime
    finally:
        await admin.close()
    log.info("created database", extra={"database": name})
    return True


async def bootstrap(
    settings: FleetSettings,
    *,
    topic_mode: TopicMode = TopicMode.CREATE,
    topics_file: Path | None = None,
) -> TopicReport:
    """Create the database if missing, migrate it, create the topics, register the tools.

    Topics are created as ``topics.yaml`` (or ``topics_file``) describes them; with
    ``TopicMode.APPLY`` the configs of existing ones are altered to match. Tools are the
    built-ins, the ``toolfleet.tools`` entry points and ``settings.tool_module_list``, as
    every executor discovers them. Returns what was found and done to the topics.
    """
    await ensure_database(settings.database_url)
    pool = await create_pool(settings.database_url, min_size=1, max_size=2)
    try:
        await migrate(pool)
        report = await sync_fleet_topics(settings, mode=topic_mode, topics_file=topics_file)
        await register_catalog(pool, discover(settings.tool_module_list))
    finally:
        await pool.close()
    return report
