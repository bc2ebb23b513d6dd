"""The registry's change notices on a real Postgres: every writer is heard, a lost
connection is noticed and re-established, and a forged ``NOTIFY`` only costs a read.

Policy and the validator keep a tool's versions for minutes while these notices reach
them (migration 0014's trigger on ``tool_versions``), so each test below uses a lookup
that would keep them for an hour: only a notice can make it read again.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest

from tests.support.agent_fixtures import manifest as support_manifest
from tests.support.eventually import eventually
from toolfleet.contract.manifest import LifecycleState, ToolManifest
from toolfleet.registry.lookup import VERSIONS_CHANGED, ToolLookup
from toolfleet.registry.store import RegistryStore
from toolfleet.settings import FleetSettings
from toolfleet.storage.pg_listen import listen_postgres
from toolfleet.storage.postgres import create_pool

pytestmark = pytest.mark.integration

HOUR = 3600.0


def manifest(tool_id: str, version: str) -> ToolManifest:
    return support_manifest(tool_id, version=version)


class CountingStore(RegistryStore):
    reads = 0

    async def versions(self, tool_id: str) -> list[ToolManifest]:
        self.reads += 1
        return await super().versions(tool_id)


@dataclass
class Listening:
    pool: asyncpg.Pool
    store: CountingStore
    lookup: ToolLookup
    live: asyncio.Event


async def resolves_to(lookup: ToolLookup, tool_id: str, version: str) -> None:
    """Wait until ``tool_id`` at ``^1`` resolves to ``version`` (a notice was heard)."""

    async def resolved() -> bool:
        return (await lookup.resolve(tool_id, "^1")).manifest.version == version

    await eventually(resolved, timeout=10)


async def reads_again(it: Listening, tool_id: str, reads: int) -> None:
    """Wait until resolving ``tool_id`` reads the registry again (its entry was dropped)."""

    async def read() -> bool:
        await it.lookup.resolve(tool_id, "^1")
        return it.store.reads > reads

    await eventually(read, timeout=10)


@contextlib.asynccontextmanager
async def listening(settings: FleetSettings) -> AsyncIterator[Listening]:
    """A lookup that keeps versions an hour either way, fed by the trigger's notices."""
    pool = await create_pool(settings.database_url)
    store = CountingStore(pool)
    lookup = ToolLookup(store, ttl_s=HOUR, pushed_ttl_s=HOUR)
    stop, live = asyncio.Event(), asyncio.Event()
    listener = asyncio.create_task(
        lookup.listen(settings.database_url, stop, subscribed=live, max_backoff_s=0.2)
    )
    try:
        await asyncio.wait_for(live.wait(), 10)
        yield Listening(pool, store, lookup, live)
    finally:
        stop.set()
        await asyncio.wait_for(listener, 10)
        await pool.close()


async def test_a_version_registered_elsewhere_is_resolved_by_the_next_call(
    settings: FleetSettings,
) -> None:
    async with listening(settings) as it:
        tool_id = f"reg__n{uuid.uuid4().hex[:8]}"
        await it.store.register(manifest(tool_id, "1.0.0"))
        assert (await it.lookup.resolve(tool_id, "^1")).manifest.version == "1.0.0"
        # Another process (an executor starting with a newer version) registers it.
        await RegistryStore(it.pool).register(manifest(tool_id, "1.1.0"))

        await resolves_to(it.lookup, tool_id, "1.1.0")


async def test_an_operators_sql_is_heard_and_a_removed_version_stops_resolving(
    settings: FleetSettings,
) -> None:
    async with listening(settings) as it:
        tool_id = f"reg__n{uuid.uuid4().hex[:8]}"
        for version in ("1.0.0", "1.1.0"):
            await it.store.register(manifest(tool_id, version))
        assert (await it.lookup.resolve(tool_id, "^1")).manifest.version == "1.1.0"
        await it.pool.execute(  # by hand, not through the store
            "UPDATE tool_versions SET lifecycle_state = $3 WHERE tool_id = $1 AND version = $2",
            tool_id,
            "1.1.0",
            LifecycleState.REMOVED.value,
        )

        await resolves_to(it.lookup, tool_id, "1.0.0")


async def test_a_killed_listen_connection_is_noticed_and_listened_again(
    settings: FleetSettings,
) -> None:
    async with listening(settings) as it:
        tool_id = f"reg__n{uuid.uuid4().hex[:8]}"
        await it.store.register(manifest(tool_id, "1.0.0"))
        await it.lookup.resolve(tool_id, "^1")
        reads = it.store.reads
        killed = await it.pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN%'"
        )
        assert killed == 1

        await reads_again(it, tool_id, reads)  # a change may have been missed
        await asyncio.wait_for(it.live.wait(), 10)  # listening again
        await it.lookup.resolve(tool_id, "^1")  # cached again, for an hour
        await RegistryStore(it.pool).register(manifest(tool_id, "1.2.0"))

        await resolves_to(it.lookup, tool_id, "1.2.0")


async def test_forged_notices_only_cost_a_read_again(settings: FleetSettings) -> None:
    async with listening(settings) as it:
        tool_id = f"reg__n{uuid.uuid4().hex[:8]}"
        await it.store.register(manifest(tool_id, "1.0.0"))
        await it.lookup.resolve(tool_id, "^1")
        reads = it.store.reads
        # Anyone who may connect may NOTIFY any channel, with any payload.
        for payload in ("", "x" * 7999, "'; DROP TABLE tool_versions; --", "\u00e9\u2603", tool_id):
            await it.pool.execute("SELECT pg_notify($1, $2)", VERSIONS_CHANGED, payload)

        await reads_again(it, tool_id, reads)  # the forged notice of the tool itself
        assert it.live.is_set()  # the listener took all of them in its stride
        assert (await it.lookup.resolve(tool_id, "^1")).manifest.version == "1.0.0"


class SilencingProxy:
    """TCP between a client and Postgres whose open connections can be silenced: they stop
    carrying bytes and nothing is closed (a half-open connection: neither end hears of
    it). Connections made afterwards carry bytes as usual."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server: asyncio.Server | None = None
        self.silenced: list[asyncio.Event] = []
        self.tasks: set[asyncio.Future[tuple[None, None]]] = set()

    async def __aenter__(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def __aexit__(self, *_exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def silence_open_connections(self) -> None:
        for silenced in self.silenced:
            silenced.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        silenced = asyncio.Event()
        self.silenced.append(silenced)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                if silenced.is_set():
                    continue  # swallowed: the other end never hears
                dst.write(data)
                await dst.drain()

        task = asyncio.ensure_future(
            asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        )
        self.tasks.add(task)
        try:
            await task
        finally:
            for w in (writer, up_writer):
                w.close()


async def test_a_line_that_went_silent_is_found_by_its_check_and_replaced(
    settings: FleetSettings,
) -> None:
    dsn = settings.database_url
    parts = urllib.parse.urlsplit(dsn)
    proxy = SilencingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    async with proxy as port:
        through = parts._replace(netloc=f"{parts.username}@127.0.0.1:{port}").geturl()
        heard: list[str] = []
        lives, losses = [], []
        stop = asyncio.Event()

        async def on_notice(payload: str) -> None:
            heard.append(payload)

        listener = asyncio.create_task(
            listen_postgres(
                through,
                "tf_line_check",
                on_notice,
                stop,
                after_listen=lambda: lives.append(1),
                after_connection_lost=lambda: losses.append(1),
                max_backoff_s=0.2,
                check_every_s=0.3,
                check_timeout_s=0.5,
            )
        )
        pool = await create_pool(dsn)
        try:
            await eventually(lambda: _now(bool(lives)), timeout=10)
            await pool.execute("NOTIFY tf_line_check, 'before'")
            await eventually(lambda: _now(heard == ["before"]), timeout=10)
            proxy.silence_open_connections()  # the line goes dead; no socket closes
            await eventually(lambda: _now(bool(losses)), timeout=10)  # the check found it
            await eventually(lambda: _now(len(lives) >= 2), timeout=10)
            await pool.execute("NOTIFY tf_line_check, 'after'")
            await eventually(lambda: _now("after" in heard), timeout=10)
        finally:
            stop.set()
            await asyncio.wait_for(listener, 10)
            await pool.close()


async def _now(value: bool) -> bool:
    return value
