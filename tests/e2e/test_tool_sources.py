"""An MCP tool source through the whole fleet: every service its own process, the
test's misbehaving MCP server started by the executor over stdio. The operator stores
the sources as ``toolfleet sources add`` does (a listing requested, nothing started);
the executor process lists them, the honest ones ``ready`` and two hostile ones
(never answering, answering one 4 MiB message) ``failed`` with typed errors while it
serves calls on."""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_http_tools import APP, serving
from tests.support.eventually import eventually
from tests.support.fleet import ProcessFleet, process_fleet
from tests.support.listing import listed
from tests.support.pipeline import Fleet, fleet_settings
from tests.support.source_servers import sandbox_state
from toolfleet.client import InvocationHandle
from toolfleet.events.envelope import Envelope
from toolfleet.events.models import (
    AgentContext,
    Effect,
    InvocationStatus,
    InvokeRequested,
    ToolOutcome,
)
from toolfleet.events.types import EventType, TopicName
from toolfleet.policy.cache import RedisPolicyCache
from toolfleet.policy.documents import TenantPolicy
from toolfleet.policy.postgres_policies import PolicyStore
from toolfleet.registry.store import RegistryStore
from toolfleet.settings import FleetSettings
from toolfleet.sources.models import HttpOperation, ListingState, SourceDefinition, SourceKind
from toolfleet.sources.rules import with_effect
from toolfleet.sources.store import SourceStore
from toolfleet.storage.postgres import create_pool
from toolfleet.storage.redis import connect_redis

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

AGENT = "did:agent:e2e-sources"
TENANT = "t_sources"
SOURCE = "e2e_src"


def tool(name: str) -> str:
    return f"mcp__{SOURCE}__{name}"


HELLO = "http__e2e_http__hello"
#: A hostile server (tests/support/hostile_source.py), for every tenant.
HOSTILE = "e2e_hostile"
WIPE, FLOOD, HOSTILE_ADD = (f"mcp__{HOSTILE}__{n}" for n in ("wipe", "flood", "add"))
#: Hostile listings (tests/support/hostile_listing.py): mode -> the typed error.
HOSTILE_LISTINGS = {"slow": "timeout", "huge": "result_too_large"}
#: A tenant whose policy wants a human to approve every external side effect.
CAREFUL = "t_careful"
NAMED = [
    *(tool(n) for n in ("add", "crash", "hang", "grow")),
    HELLO,
    FLOOD,
    HOSTILE_ADD,
    "core__echo",
]


@pytest.fixture(scope="module")
def server_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("e2e-source-state")


@pytest.fixture(scope="module")
def hostile_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sandbox_state(tmp_path_factory.mktemp("e2e-hostile-state"))


async def write_policy(
    settings: FleetSettings, allow: list[str], *, tenant: str = TENANT, **more: Any
) -> None:
    pool = await create_pool(settings.database_url)
    try:
        policy = TenantPolicy(allow_tools=allow, **more)
        await PolicyStore(pool).write(tenant, policy, "test:operator")
    finally:
        await pool.close()
    redis = connect_redis(settings.redis_url)
    try:
        await RedisPolicyCache(redis).announce(tenant)
    finally:
        await redis.aclose()


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings,
    module_database_url: str,
    module_redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    server_state: Path,
    hostile_state: Path,
) -> AsyncIterator[tuple[Fleet, ProcessFleet]]:
    home: Path = tmp_path_factory.mktemp("e2e-sources")
    # Databases of the module's own: the sources it adds (hostile ones among them) must
    # not outlive it into the next module's fleet, whose executors would list them.
    local = fleet_settings(
        settings,
        home,
        session_timeout_ms=6000,
        database_url=module_database_url,
        redis_url=module_redis_url,
    )
    async with serving(APP) as api:
        names = await register_sources(local, server_state, api, hostile_state)
        await write_policy(local, NAMED)
        await write_policy(
            local, [WIPE], tenant=CAREFUL, approval_effects=[Effect.EXTERNAL_SIDE_EFFECT]
        )
        async with process_fleet(local, home) as running:
            # The executor lists what the operator added; the tests need the honest ones.
            for name in names:
                listing = await listed(local.database_url, name, timeout=120)
                assert listing.state is ListingState.READY, (listing, running[1].logs())
            yield running


async def register_sources(
    local: FleetSettings, server_state: Path, api: str, hostile_state: Path
) -> list[str]:
    """The operator stores the sources (as `toolfleet sources add` does: each requests a
    listing, nothing is started here); return the names of those that list honestly."""
    pool = await create_pool(local.database_url)
    try:
        store = SourceStore(pool)
        sandbox_state(server_state)  # the executor runs the server sandboxed, as its own uid
        source = SourceDefinition(
            name=SOURCE,
            kind=SourceKind.MCP_STDIO,
            target=f"{sys.executable} -m tests.support.source_servers {server_state}",
            filesystem_permissions=[f"rw:{server_state}"],
            tenant_id=TENANT,
            timeout_s=60,
        )
        http = SourceDefinition(
            name="e2e_http",
            kind=SourceKind.HTTP,
            target=api,
            operations=[
                HttpOperation(
                    operation_id="hello",
                    url="/hello",
                    query=["name"],
                    input_schema={"type": "object", "properties": {"name": {"type": "string"}}},
                    output_schema={"type": "object", "properties": {"hello": {"type": "string"}}},
                )
            ],
        )
        hostile = SourceDefinition(
            name=HOSTILE,
            kind=SourceKind.MCP_STDIO,
            target=f"{sys.executable} -m tests.support.hostile_source {hostile_state}",
            filesystem_permissions=[f"rw:{hostile_state}"],
            timeout_s=60,
        )
        listers = [
            SourceDefinition(
                name=f"e2e_listing_{mode}",
                kind=SourceKind.MCP_STDIO,
                target=f"{sys.executable} -m tests.support.hostile_listing {mode}",
                timeout_s=2 if mode == "slow" else 60,
                max_response_bytes=1_048_576,
            )
            for mode in HOSTILE_LISTINGS
        ]
        for each in (source, http, hostile, *listers):
            assert (await store.put(each)).state is ListingState.PENDING
    finally:
        await pool.close()
    return [source.name, http.name, hostile.name]


async def invoke(
    running: Fleet,
    tool_id: str,
    *,
    network: list[str] | None = None,
    tenant: str = TENANT,
    **parameters: Any,
) -> InvocationHandle:
    return await running.client.publish(
        InvokeRequested(
            invocation_id=uuid.uuid4(),
            tool_id=tool_id,
            agent_context=AgentContext(agent_did=AGENT, tenant_id=tenant),
            parameters=parameters,
            capability_token=running.token(tenant, AGENT, network_permissions=network),
        )
    )


async def call(
    running: Fleet, tool_id: str, *, network: list[str] | None = None, **parameters: Any
) -> ToolOutcome:
    handle = await invoke(running, tool_id, network=network, **parameters)
    return await running.client.wait(handle, timeout=90)


async def test_an_http_tool_reaches_only_hosts_the_token_grants(
    fleet: tuple[Fleet, ProcessFleet],
) -> None:
    running, procs = fleet
    granted = await call(running, HELLO, network=["127.0.0.1:*"], name="fleet")
    assert granted.status is InvocationStatus.SUCCESS, (granted.error, procs.logs())
    assert granted.result == {"hello": "fleet"}
    refused = await call(running, HELLO, network=["api.example.com"], name="fleet")
    assert refused.status is InvocationStatus.PERMISSION_DENIED
    assert refused.error is not None
    assert refused.error.code == "permission_denied"
    assert refused.error.details["host"] == "127.0.0.1"


async def test_a_call_succeeds_end_to_end(fleet: tuple[Fleet, ProcessFleet]) -> None:
    running, procs = fleet
    outcome = await call(running, tool("add"), a=2, b=40)
    assert outcome.status is InvocationStatus.SUCCESS, (outcome.error, procs.logs())
    assert outcome.result is not None
    assert outcome.result["content"] == [{"type": "text", "text": "sum=42"}]
    # No allowlist set: only the content text passes; the rest is redacted.
    assert outcome.result["structured_content"] == {"result": "[REDACTED]"}
    assert (outcome.tool_version or "").startswith("1.0.0+h")


async def test_a_tool_added_at_run_time_stays_disabled_until_a_policy_names_it(
    fleet: tuple[Fleet, ProcessFleet],
) -> None:
    running, _ = fleet
    assert (await call(running, tool("grow"))).status is InvocationStatus.SUCCESS
    pool = await create_pool(running.settings.database_url)
    try:

        async def registered() -> bool:
            return bool(await RegistryStore(pool).versions(tool("late")))

        assert await eventually(registered, timeout=30)
    finally:
        await pool.close()
    refused = await call(running, tool("late"), x="hi")
    assert refused.status is InvocationStatus.PERMISSION_DENIED

    async def audited() -> list[Envelope]:
        return [
            e
            for e in await running.read(TopicName.AUDIT)
            if e.type == EventType.SOURCE_TOOL_ADDED and e.data.get("tool_id") == tool("late")
        ]

    [record] = await eventually(audited, timeout=30)
    assert record.data["source_event"]["source"] == "/toolfleet/executor"

    await write_policy(running.settings, [*NAMED, tool("late")])

    async def allowed() -> ToolOutcome | None:
        outcome = await call(running, tool("late"), x="hi")
        return outcome if outcome.status is InvocationStatus.SUCCESS else None

    outcome = await eventually(allowed, timeout=30, interval=0.5)
    assert outcome.result is not None
    assert outcome.result["content"] == [{"type": "text", "text": "hi"}]


async def test_a_crash_is_restarted_and_the_call_gets_a_retryable_outcome(
    fleet: tuple[Fleet, ProcessFleet], server_state: Path
) -> None:
    running, procs = fleet
    assert (await call(running, tool("add"), a=1, b=1)).status is InvocationStatus.SUCCESS
    starts = len((server_state / "starts").read_text().split())
    crashed = await call(running, tool("crash"))
    assert crashed.status is InvocationStatus.ERROR, procs.logs()
    assert crashed.error is not None
    assert (crashed.error.code, crashed.error.retryable) == ("external_api_error", True)
    again = await call(running, tool("add"), a=1, b=2)
    assert again.status is InvocationStatus.SUCCESS
    assert len((server_state / "starts").read_text().split()) == starts + 1


async def test_cancel_reaches_the_server(
    fleet: tuple[Fleet, ProcessFleet], server_state: Path
) -> None:
    running, _ = fleet
    handle = await invoke(running, tool("hang"))

    async def hanging() -> bool:
        return (server_state / "hanging").exists()

    assert await eventually(hanging, timeout=60)
    await running.client.cancel(handle.invocation_id, tenant_id=TENANT)
    outcome = await running.client.wait(handle, timeout=60)
    assert outcome.status is InvocationStatus.CANCELLED

    async def told() -> bool:
        return (server_state / "cancelled").exists()

    assert await eventually(told, timeout=30)


async def test_a_server_cannot_vouch_for_its_destructive_tool(
    fleet: tuple[Fleet, ProcessFleet], hostile_state: Path
) -> None:
    running, procs = fleet
    # ``wipe`` says readOnlyHint: true; the careful tenant's policy still parks it.
    parked = await invoke(running, WIPE, tenant=CAREFUL)

    async def approval_asked() -> list[Envelope]:
        return [
            e
            for e in await running.read(TopicName.EVENTS, invocation_id=str(parked.invocation_id))
            if e.type == EventType.APPROVAL_REQUESTED
        ]

    assert await eventually(approval_asked, timeout=30), procs.logs()
    assert not (hostile_state / "wiped").exists()

    # The operator vouches for it (``toolfleet sources configure e2e_hostile wipe
    # --effect read_only``): then it runs without an approval.
    pool = await create_pool(running.settings.database_url)
    try:
        store = SourceStore(pool)
        await store.update(HOSTILE, lambda s: with_effect(s, "wipe", "read_only"))
        await store.restate_rules(HOSTILE)
    finally:
        await pool.close()

    async def runs() -> ToolOutcome | None:
        handle = await invoke(running, WIPE, tenant=CAREFUL)
        try:
            return await running.client.wait(handle, timeout=5)
        except TimeoutError:
            return None  # parked still: policy's registry cache has not seen it yet

    outcome = await eventually(runs, timeout=40, interval=0.5)
    assert outcome.status is InvocationStatus.SUCCESS, (outcome.error, procs.logs())
    assert (hostile_state / "wiped").exists()


async def test_a_flooding_server_loses_its_session_not_the_executor(
    fleet: tuple[Fleet, ProcessFleet], hostile_state: Path
) -> None:
    running, procs = fleet
    assert (await call(running, HOSTILE_ADD, a=1, b=1)).status is InvocationStatus.SUCCESS
    flood = await invoke(running, FLOOD)

    async def flooding() -> bool:
        return (hostile_state / "flooding").exists()

    assert await eventually(flooding, timeout=60), procs.logs()
    # 8 MiB of one 64 MiB message are in, the server is holding the rest: another
    # tenant-visible call on the same executor completes meanwhile.
    echo = await call(running, "core__echo", message="still here")
    assert echo.status is InvocationStatus.SUCCESS, (echo.error, procs.logs())
    (hostile_state / "release").write_text("yes")
    outcome = await running.client.wait(flood, timeout=30)
    assert outcome.status is InvocationStatus.ERROR, procs.logs()
    assert outcome.error is not None
    assert (outcome.error.code, outcome.error.retryable) == ("result_too_large", False)
    (hostile_state / "release").unlink()
    again = await call(running, HOSTILE_ADD, a=2, b=2)
    assert again.status is InvocationStatus.SUCCESS, (again.error, procs.logs())


async def test_hostile_listings_fail_typed_and_the_executor_serves_on(
    fleet: tuple[Fleet, ProcessFleet],
) -> None:
    running, procs = fleet
    for mode, code in HOSTILE_LISTINGS.items():
        listing = await listed(running.settings.database_url, f"e2e_listing_{mode}", timeout=120)
        assert listing.state is ListingState.FAILED, (listing, procs.logs())
        assert listing.error is not None
        assert listing.error.code == code
    echo = await call(running, "core__echo", message="still here")
    assert echo.status is InvocationStatus.SUCCESS, (echo.error, procs.logs())
