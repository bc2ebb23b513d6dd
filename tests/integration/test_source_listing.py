"""The executor's listing job against real stdio MCP servers (sandboxed, as an executor
that can run sandboxes starts them) and real Postgres: a hostile server's listing
(slow, huge, endless, garbage, too many or colliding tools) is stored ``failed`` with a
typed error and registers nothing, and the job lists the honest source beside them."""

from __future__ import annotations

import sys
import uuid

import pytest

from tests.integration.test_mcp_sources import SERVER_UID
from tests.support.databases import database_before
from tests.support.listing import listed, listing_executor
from toolfleet.errors import ErrorCode
from toolfleet.isolation.sandbox import probe
from toolfleet.isolation.stdio import StdioSandbox
from toolfleet.registry.store import RegistryStore
from toolfleet.sources.models import HttpOperation, ListingState, SourceDefinition, SourceKind
from toolfleet.sources.pool import SessionPool
from toolfleet.sources.provider import SourceCatalog
from toolfleet.sources.store import ListingStore, SourceStore
from toolfleet.storage.postgres import create_pool, migrate, migration_files

pytestmark = pytest.mark.integration

#: mode -> (error code, retryable); see tests/support/hostile_listing.py.
HOSTILE = {
    "slow": (ErrorCode.TIMEOUT, True),
    "huge": (ErrorCode.RESULT_TOO_LARGE, False),
    "many": (ErrorCode.RESULT_TOO_LARGE, False),
    "endless": (ErrorCode.RESULT_TOO_LARGE, False),
    "garbage": (ErrorCode.RESULT_VALIDATION_FAILED, False),
    "clash": (ErrorCode.RESULT_VALIDATION_FAILED, False),
}


def lister(mode: str) -> SourceDefinition:
    return SourceDefinition(
        name=f"{mode}_{uuid.uuid4().hex[:6]}",
        kind=SourceKind.MCP_STDIO,
        target=f"{sys.executable} -m tests.support.hostile_listing {mode}",
        timeout_s=3 if mode == "slow" else 60,  # the listing's deadline
        max_response_bytes=1_048_576,  # the huge one's single message is 4 MiB
    )


async def test_hostile_listings_fail_typed_and_the_honest_one_is_listed(
    module_database_url: str,
) -> None:
    support = probe()
    assert support.sandboxes, support.problem
    sources = {mode: lister(mode) for mode in [*HOSTILE, "ok"]}
    pool = await create_pool(module_database_url)
    try:
        store = SourceStore(pool)
        for source in sources.values():
            assert (await store.put(source)).state is ListingState.PENDING
        launcher = StdioSandbox(support=support, uid=SERVER_UID)
        async with listing_executor(module_database_url, launcher=launcher) as job:
            answers = {m: await listed(module_database_url, s.name) for m, s in sources.items()}
            assert not job.done()  # nothing a source answered stopped the job

        ok = answers.pop("ok")
        assert (ok.state, ok.tools, ok.error) == (ListingState.READY, 1, None)
        [add] = await store.tools(sources["ok"].name)
        assert add.effect == "external_side_effect"  # its readOnlyHint is not trusted
        assert add.hints == {"readOnlyHint": True}
        [manifest] = await RegistryStore(pool).versions(add.tool_id)
        assert manifest.effect.value == "external_side_effect"

        got = {
            mode: (a.state, a.error.code if a.error else None, a.error and a.error.retryable)
            for mode, a in answers.items()
        }
        assert got == {m: (ListingState.FAILED, code, r) for m, (code, r) in HOSTILE.items()}
        for mode, answer in answers.items():
            assert await store.tools(sources[mode].name) == [], mode  # nothing registered
            assert answer.error is not None
            assert len(answer.error.message) < 300, mode  # no server text piped through
        assert answers["slow"].next_attempt_at is not None  # a timeout is tried again
        assert answers["huge"].next_attempt_at is None  # a hostile answer is not
    finally:
        await pool.close()


async def test_a_listing_made_on_list_changed_counts_only_for_the_stored_definition(
    module_database_url: str,
) -> None:
    def http(name: str, path: str) -> SourceDefinition:
        return SourceDefinition(
            name=name,
            kind=SourceKind.HTTP,
            target="http://127.0.0.1:9",
            operations=[HttpOperation(operation_id="get_pet", url=path)],
        )

    name = f"l{uuid.uuid4().hex[:8]}"
    pool = await create_pool(module_database_url)
    sessions = SessionPool()
    try:
        store = SourceStore(pool)
        catalog = SourceCatalog(store=store, pool=sessions, worker="executor-7")
        old, new = http(name, "/pets"), http(name, "/v2/pets")
        await store.put(old)
        await store.put(new)  # replaced before any executor listed the old one
        await catalog.refresh(old, via="list_changed")
        listing = await store.listings.get(name)
        assert listing is not None
        assert (listing.state, listing.request) == (ListingState.PENDING, 2)
        await catalog.refresh(new, via="list_changed")
        listing = await store.listings.get(name)
        assert listing is not None
        assert (listing.state, listing.listed_by, listing.tools) == (
            ListingState.READY,
            "executor-7",
            1,
        )
    finally:
        await sessions.close()
        await pool.close()


LISTINGS = "0013_source_listings.sql"


async def test_sources_stored_before_listings_existed_get_one(postgres_admin_url: str) -> None:
    async with database_before(postgres_admin_url, LISTINGS) as pool:
        async with pool.acquire() as conn:
            for source, tenant in (("listed", "tenant_a"), ("unlisted", "*")):
                await conn.execute(
                    "INSERT INTO tool_sources (name, tenant_id, kind, target, definition)"
                    " VALUES ($1, $2, 'mcp_stdio', 'server', '{}')",
                    source,
                    tenant,
                )
            for tool_id, version in (("mcp__listed__a", "1"), ("mcp__listed__a", "2")):
                await conn.execute(
                    "INSERT INTO tool_source_tools (tool_id, version, source_name, remote_name,"
                    " discovered_via, tool) VALUES ($1, $2, 'listed', 'a', 'add', '{}')",
                    tool_id,
                    version,
                )
        assert await migrate(pool) == [f for f, _ in migration_files() if f >= LISTINGS]
        listings = ListingStore(pool)
        listed_before = await listings.get("listed")
        assert listed_before is not None
        assert (listed_before.state, listed_before.tools, listed_before.tenant_id) == (
            ListingState.READY,
            1,  # one tool, at two versions
            "tenant_a",
        )
        unlisted = await listings.get("unlisted")
        assert unlisted is not None
        assert (unlisted.state, unlisted.tools) == (ListingState.PENDING, None)
