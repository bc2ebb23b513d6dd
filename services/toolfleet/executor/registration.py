"""Executors register their tools' manifests in the Postgres registry at start."""

from __future__ import annotations

import logging

import asyncpg

from toolfleet.registry.catalog import ToolCatalog
from toolfleet.registry.store import RegistryStore

log = logging.getLogger(__name__)


async def register_catalog(pool: asyncpg.Pool, catalog: ToolCatalog) -> list[str]:
    """Register every tool of ``catalog``; return the ``id@version`` newly added.

    The same id and version with a different schema raises ``RegistrationError``.
    """
    store = RegistryStore(pool)
    added = []
    for spec in catalog:
        if await store.register(spec.manifest()):
            added.append(f"{spec.tool_id}@{spec.version}")
    if added:
        log.info("registered tools", extra={"tools": added})
    return added
