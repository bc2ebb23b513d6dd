"""The executor's side of a source listing, in the test's process: for tests that call the
API (which only requests listings) and run no executor process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tests.support.eventually import eventually
from toolfleet.sources.listing import ListingJob
from toolfleet.sources.models import ListingState, SourceListing
from toolfleet.sources.pool import SessionPool, StdioLauncher
from toolfleet.sources.provider import SourceCatalog
from toolfleet.sources.store import ListingStore, SourceStore
from toolfleet.storage.postgres import create_pool


@contextlib.asynccontextmanager
async def listing_executor(
    database_url: str, *, launcher: StdioLauncher | None = None, worker: str = "test-executor"
) -> AsyncIterator[asyncio.Task[None]]:
    """An executor's listing job over ``database_url`` until the block ends (its task:
    still running at the end means nothing a source answered stopped it)."""
    pool = await create_pool(database_url)
    sessions = SessionPool(launcher=launcher)
    catalog = SourceCatalog(store=SourceStore(pool), pool=sessions)
    sessions.on_tools_changed = catalog.on_tools_changed
    job = ListingJob(queue=ListingStore(pool), lister=catalog, worker=worker, poll_s=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(job.run(stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)
        await sessions.close()
        await pool.close()


async def listed(database_url: str, name: str, *, timeout: float = 60) -> SourceListing:
    """The listing of source ``name`` once it is no longer pending."""
    pool = await create_pool(database_url)
    try:

        async def done() -> SourceListing | None:
            listing = await ListingStore(pool).get(name)
            if listing is None or listing.state is ListingState.PENDING:
                return None
            return listing

        found: SourceListing = await eventually(done, timeout=timeout)
        return found
    finally:
        await pool.close()
