"""CLI commands against a real API server (uvicorn) and the real broker."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import uvicorn
from aiokafka import AIOKafkaConsumer
from typer.testing import CliRunner, Result

from tests.support.eventually import eventually
from tests.support.listing import listing_executor
from tests.support.servers import free_port
from toolfleet.api import ApiSettings, create_app
from toolfleet.api.resources import ApiResources
from toolfleet.auth.grants import ensure_grant_key
from toolfleet.auth.keys import generate_key_pair
from toolfleet.auth.outcomes import OutcomeSigner
from toolfleet.auth.tokens import TokenVerifier
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.producer import EventProducer, Outbound
from toolfleet.cli.main import app as cli
from toolfleet.contract.manifest import ToolCategory, ToolManifest
from toolfleet.errors import ErrorCode, ErrorInfo
from toolfleet.events.codec import decode
from toolfleet.events.envelope import new_event
from toolfleet.events.models import CheckpointCreated, Effect, InvocationStatus, ToolOutcome
from toolfleet.events.types import EventType, Source, TopicName, topic
from toolfleet.executor.registration import register_catalog
from toolfleet.registry.catalog import discover
from toolfleet.registry.store import RegistryStore
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cli_env(settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    pair = generate_key_pair()
    folder = tmp_path_factory.mktemp("cli-keys")
    (folder / "private.pem").write_bytes(pair.private_pem)
    (folder / "public.pem").write_bytes(pair.public_pem)
    ensure_grant_key(folder / "grant.key")  # the API refuses to start without it
    return {
        "TOOLFLEET_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "TOOLFLEET_REDIS_URL": settings.redis_url,
        "TOOLFLEET_DATABASE_URL": settings.database_url,
        "TOOLFLEET_TOPIC_PREFIX": settings.topic_prefix,
        "TOOLFLEET_API_URL": f"http://127.0.0.1:{free_port()}",
        "TOOLFLEET_JWT_PRIVATE_KEY_FILE": str(folder / "private.pem"),
        "TOOLFLEET_JWT_PUBLIC_KEY_FILE": str(folder / "public.pem"),
        "TOOLFLEET_GRANT_KEY_FILE": str(folder / "grant.key"),
    }


@pytest.fixture(scope="module")
async def server(cli_env: dict[str, str]) -> AsyncIterator[ApiResources]:
    """The API served by uvicorn on the port ``TOOLFLEET_API_URL`` names."""
    settings = ApiSettings(
        kafka_bootstrap=cli_env["TOOLFLEET_KAFKA_BOOTSTRAP"],
        redis_url=cli_env["TOOLFLEET_REDIS_URL"],
        database_url=cli_env["TOOLFLEET_DATABASE_URL"],
        topic_prefix=cli_env["TOOLFLEET_TOPIC_PREFIX"],
        api_url=cli_env["TOOLFLEET_API_URL"],
        jwt_private_key_file=Path(cli_env["TOOLFLEET_JWT_PRIVATE_KEY_FILE"]),
        jwt_public_key_file=Path(cli_env["TOOLFLEET_JWT_PUBLIC_KEY_FILE"]),
        grant_key_file=Path(cli_env["TOOLFLEET_GRANT_KEY_FILE"]),
    )
    application = create_app(settings)
    port = int(settings.api_url.rsplit(":", 1)[1])
    config = uvicorn.Config(application, host="127.0.0.1", port=port, log_config=None)
    uv = uvicorn.Server(config)
    task = asyncio.create_task(uv.serve())
    await eventually(lambda: asyncio.sleep(0, result=uv.started), timeout=20)
    yield application.state.resources
    uv.should_exit = True
    await task


@pytest.fixture
async def lister(cli_env: dict[str, str]) -> AsyncIterator[None]:
    """What an executor does for the API: list the sources it asks for."""
    async with listing_executor(cli_env["TOOLFLEET_DATABASE_URL"]):
        yield


async def run_cli(env: dict[str, str], *args: str) -> Result:
    """Run the CLI in a thread: it makes blocking calls to the server on this loop."""
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args), env=env)


async def test_invoke_without_wait_publishes_with_a_minted_token(
    server: ApiResources, cli_env: dict[str, str], settings: FleetSettings
) -> None:
    tenant = f"tenant_{uuid.uuid4().hex[:8]}"
    result = await run_cli(
        cli_env,
        "invoke",
        "core__long_running",
        "--tenant",
        tenant,
        "-p",
        "steps=5",
        "-p",
        "step_seconds=0.1",
        "--json",
    )
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["status"] == "pending"

    consumer = AIOKafkaConsumer(
        topic(settings.topic_prefix, TopicName.REQUESTED),
        **connection_kwargs(settings),
        auto_offset_reset="earliest",
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    found = []
    try:

        async def scan() -> bool:
            for records in (await consumer.getmany(timeout_ms=100)).values():
                for r in records:
                    event = decode(key=r.key, value=r.value, headers=list(r.headers))
                    if event.invocationid == printed["invocation_id"]:
                        found.append(event)
            return bool(found)

        await eventually(scan, timeout=15)
    finally:
        await consumer.stop()
    event = found[0]
    assert event.source == "/toolfleet/cli"
    assert event.data["parameters"] == {"steps": 5, "step_seconds": 0.1}
    assert event.data["agent_context"]["agent_did"] == "did:agent:cli"
    verifier = TokenVerifier.from_file(
        Path(cli_env["TOOLFLEET_JWT_PUBLIC_KEY_FILE"]), issuer="toolfleet", audience="toolfleet"
    )
    capability = verifier.verify(event.data["capability_token"])
    assert (capability.tenant_id, capability.tool_id) == (tenant, "core__long_running")


async def test_status_cancel_approve_and_tools(
    server: ApiResources, cli_env: dict[str, str]
) -> None:
    tenant = f"tenant_{uuid.uuid4().hex[:8]}"
    invocation_id = uuid.uuid4()
    await server.pool.execute(
        """INSERT INTO tool_invocations (invocation_id, tenant_id, tool_id, tool_version,
               status, status_rank, result, created_at)
           VALUES ($1, $2, 'core__echo', '1.0.0', 'success', 9, $3, $4)""",
        invocation_id,
        tenant,
        {"message": "hi", "length": 2},
        datetime.now(UTC),
    )
    status = await run_cli(cli_env, "status", str(invocation_id), "--json")
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)["result"] == {"message": "hi", "length": 2}

    human = await run_cli(cli_env, "status", str(invocation_id))
    assert human.exit_code == 0, human.output
    assert "success" in human.stdout

    cancel = await run_cli(cli_env, "cancel", str(invocation_id))
    assert cancel.exit_code == 0, cancel.output
    assert "already finished with status success" in cancel.stdout

    approve = await run_cli(cli_env, "approve", str(invocation_id))
    assert approve.exit_code == 1
    assert "not pending_approval" in approve.stderr

    missing = await run_cli(cli_env, "status", str(uuid.uuid4()))
    assert missing.exit_code == 1
    assert "no such invocation" in missing.stderr

    await register_catalog(server.pool, discover([]))
    tools = await run_cli(cli_env, "tools", "list", "--json")
    assert tools.exit_code == 0, tools.output
    assert "core__echo" in {t["tool_id"] for t in json.loads(tools.stdout)}
    table = await run_cli(cli_env, "tools", "list")
    assert "core__get_current_time" in table.stdout


async def test_tools_search_and_lifecycle_commands(
    server: ApiResources, cli_env: dict[str, str]
) -> None:
    await register_catalog(server.pool, discover([]))
    tool_id = f"cli__t{uuid.uuid4().hex[:8]}"
    store = RegistryStore(server.pool)
    for version in ("1.0.0", "2.0.0"):
        await store.register(
            ToolManifest(
                tool_id=tool_id,
                version=version,
                effect=Effect.READ_ONLY,
                description="Water the office plants and log soil moisture.",
                category=ToolCategory.PRODUCTIVITY,
                input_schema={"type": "object"},
                output_schema={"type": "object"},
                redaction_allowlist=[],
                timeout_seconds=5,
            )
        )
    found = await run_cli(cli_env, "tools", "search", "did anyone water the plants", "--json")
    assert found.exit_code == 0, found.output
    assert json.loads(found.stdout)[0]["tool_id"] == tool_id

    deprecated = await run_cli(
        cli_env,
        "tools",
        "deprecate",
        f"{tool_id}@1.0.0",
        "--in-favor-of",
        "2.0.0",
        "--date",
        "2099-01-31",
    )
    assert deprecated.exit_code == 0, deprecated.output
    assert "active → deprecated" in deprecated.stdout
    assert "2099-01-31" in deprecated.stdout
    listed = await run_cli(cli_env, "tools", "list", "--category", "productivity", "--json")
    (mine,) = [t for t in json.loads(listed.stdout) if t["tool_id"] == tool_id]
    old = mine["versions"][1]
    assert (old["version"], old["deprecated"], old["sunset_date"][:10]) == (
        "1.0.0",
        True,
        "2099-01-31",
    )

    sunset = await run_cli(cli_env, "tools", "sunset", f"{tool_id}@1.0.0", "--json")
    assert json.loads(sunset.stdout)["lifecycle_state"] == "sunset"
    removed = await run_cli(cli_env, "tools", "remove", f"{tool_id}@1.0.0")
    assert removed.exit_code == 0, removed.output
    backwards = await run_cli(cli_env, "tools", "deprecate", f"{tool_id}@1.0.0")
    assert backwards.exit_code == 1
    assert "409" in backwards.stderr
    malformed = await run_cli(cli_env, "tools", "remove", tool_id)
    assert malformed.exit_code == 1
    assert "TOOL@VERSION" in malformed.stderr


async def test_a_foreign_token_is_refused(server: ApiResources, cli_env: dict[str, str]) -> None:
    result = await run_cli(cli_env, "tools", "list", "--token", "not-a-real-token")
    assert result.exit_code == 1
    assert "refused the token" in result.stderr
    assert "not-a-real-token" not in result.output


def _signing(settings: FleetSettings, cli_env: dict[str, str]) -> FleetSettings:
    """``settings`` with the grant key the CLI checks outcomes with."""
    return settings.model_copy(update={"grant_key_file": Path(cli_env["TOOLFLEET_GRANT_KEY_FILE"])})


async def _answer_invokes(settings: FleetSettings, tenant: str, status: str) -> None:
    """Play the fleet for ``tenant``: a checkpoint at 50 %, then a terminal outcome,
    signed with the grant key of ``settings`` as the fleet's services sign theirs."""
    producer = EventProducer(settings, before_send=OutcomeSigner.from_settings(settings).seal)
    await producer.start()
    consumer = AIOKafkaConsumer(
        topic(settings.topic_prefix, TopicName.REQUESTED),
        **connection_kwargs(settings),
        auto_offset_reset="earliest",
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    try:
        while True:
            for records in (await consumer.getmany(timeout_ms=100)).values():
                for r in records:
                    request = decode(key=r.key, value=r.value, headers=list(r.headers))
                    if request.tenantid != tenant:
                        continue
                    invocation_id = request.invocationid or ""
                    checkpoint = new_event(
                        event_type=EventType.CHECKPOINT_CREATED,
                        source=Source.EXECUTOR,
                        data=CheckpointCreated(
                            invocation_id=uuid.UUID(invocation_id),
                            tenant_id=tenant,
                            tool_id="core__echo",
                            checkpoint_id="c1",
                            progress_percent=50,
                            current_phase="halfway",
                            timestamp=datetime.now(UTC),
                        ),
                        tenant_id=tenant,
                        invocation_id=invocation_id,
                    )
                    outcome = new_event(
                        event_type=EventType.SUCCEEDED if status == "success" else EventType.FAILED,
                        source=Source.VALIDATOR,
                        data=ToolOutcome(
                            invocation_id=uuid.UUID(invocation_id),
                            status=InvocationStatus(status),
                            agent_did="did:agent:cli",
                            tenant_id=tenant,
                            tool_id="core__echo",
                            tool_version="1.0.0",
                            result={"message": "hi", "length": 2} if status == "success" else None,
                            error=None
                            if status == "success"
                            else ErrorInfo(code=ErrorCode.TOOL_EXECUTION_ERROR, message="boom"),
                        ),
                        tenant_id=tenant,
                        invocation_id=invocation_id,
                    )
                    await producer.send(
                        Outbound(
                            envelope=checkpoint,
                            topic=topic(settings.topic_prefix, TopicName.EVENTS),
                        )
                    )
                    await producer.send(
                        Outbound(
                            envelope=outcome, topic=topic(settings.topic_prefix, TopicName.RESULTS)
                        )
                    )
    finally:
        await consumer.stop()
        await producer.stop()


@pytest.mark.parametrize(("status", "exit_code"), [("success", 0), ("error", 1)])
async def test_invoke_wait_exits_zero_only_on_success(
    cli_env: dict[str, str], settings: FleetSettings, status: str, exit_code: int
) -> None:
    tenant = f"tenant_{uuid.uuid4().hex[:8]}"
    fleet = asyncio.create_task(_answer_invokes(_signing(settings, cli_env), tenant, status))
    try:
        result = await run_cli(
            cli_env,
            "invoke",
            "core__echo",
            "--tenant",
            tenant,
            "-p",
            "message=hi",
            "--wait",
            "--timeout",
            "20",
            "--json",
        )
    finally:
        fleet.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fleet
    assert result.exit_code == exit_code, result.output
    outcome = json.loads(result.stdout)
    assert outcome["status"] == status
    if status == "success":
        assert outcome["result"] == {"message": "hi", "length": 2}
    else:
        assert outcome["error"]["code"] == "tool_execution_error"


async def test_invoke_wait_human_output(cli_env: dict[str, str], settings: FleetSettings) -> None:
    tenant = f"tenant_{uuid.uuid4().hex[:8]}"
    fleet = asyncio.create_task(_answer_invokes(_signing(settings, cli_env), tenant, "success"))
    try:
        result = await run_cli(
            cli_env,
            "invoke",
            "core__echo",
            "--tenant",
            tenant,
            "-p",
            "message=hi",
            "--wait",
        )
    finally:
        fleet.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await fleet
    assert result.exit_code == 0, result.output
    assert "success" in result.stdout
    assert "core__echo@1.0.0" in result.stdout
    assert '"length": 2' in result.stdout


async def test_sources_configure_and_the_policy_glob_warning(
    server: ApiResources, cli_env: dict[str, str], tmp_path: Path, lister: None
) -> None:
    name = f"s{uuid.uuid4().hex[:8]}"
    command = f"{sys.executable} -m tests.support.source_servers {tmp_path / 'server'}"
    added = await run_cli(cli_env, "sources", "add", name, "--stdio", command)
    assert added.exit_code == 0, added.output
    configured = await run_cli(
        cli_env,
        *("sources", "configure", name, "add", "--allow", "content.text"),
        *("--result-validation", "coerce", "--sanitize", "$.content[*].text=escape"),
        *("--max-result-bytes", "4096"),
    )
    assert configured.exit_code == 0, configured.output
    assert "  allow: content.text\n" in configured.stdout
    assert "result_validation: coerce, sanitize: 1 paths, max_result_bytes: 4096" in (
        configured.stdout
    )
    typo = await run_cli(cli_env, "sources", "configure", name, "add", "--sanitize", "*=shred")
    assert typo.exit_code != 0
    assert "not valid result rules" in typo.stderr

    policy = tmp_path / "policy.yaml"
    policy.write_text(f'allow_tools: ["mcp__{name}__*", "mcp__{name}__add"]\n')
    applied = await run_cli(cli_env, "policy", "apply", str(policy), "--tenant", "t_cli_src")
    assert applied.exit_code == 0, applied.output
    assert f"warning: allow_tools.0 'mcp__{name}__*' allows no MCP or HTTP" in applied.stdout


async def test_sources_configure_effect_shows_hints_and_keeps_the_rules(
    server: ApiResources, cli_env: dict[str, str], tmp_path: Path, lister: None
) -> None:
    name = f"h{uuid.uuid4().hex[:8]}"
    command = f"{sys.executable} -m tests.support.hostile_source {tmp_path / 'server'}"
    added = await run_cli(cli_env, "sources", "add", name, "--stdio", command)
    assert added.exit_code == 0, added.output
    # The server says wipe is read-only: shown as its hint, not taken as its effect.
    assert (
        "external_side_effect  (source hints, not trusted: destructiveHint=false, "
        "readOnlyHint=true)"
    ) in added.stdout
    allowed = await run_cli(cli_env, "sources", "configure", name, "wipe", "--allow", "content")
    assert allowed.exit_code == 0, allowed.output
    vouched = await run_cli(cli_env, "sources", "configure", name, "wipe", "--effect", "read_only")
    assert vouched.exit_code == 0, vouched.output
    assert f"mcp__{name}__wipe@" in vouched.stdout
    assert "read_only" in vouched.stdout
    assert "  allow: content\n" in vouched.stdout  # only --effect: the rules stay
    wrong = await run_cli(cli_env, "sources", "configure", name, "wipe", "--effect", "harmless")
    assert wrong.exit_code != 0
