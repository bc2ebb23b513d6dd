"""A planted credential never leaves the executor: not on a topic, in a log or in Postgres.

The whole fleet runs as processes with a random secret in the env backend. A tool that
uses it properly succeeds; a tool that tries every way out (result, base64, error
message, checkpoint) fails with ``redaction_failed``. Then every message on every topic
of the fleet (raw key, headers and value bytes), every worker log and every column of
every table in Postgres is searched for the value and its base64.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest
from aiokafka import AIOKafkaConsumer

from tests.support.eventually import eventually
from tests.support.fleet import ALL_SERVICES, ProcessFleet, process_fleet
from tests.support.pipeline import Fleet, fleet_settings
from toolfleet.bus.connection import connection_kwargs
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.events.types import TopicName
from toolfleet.secrets.capability import encodings
from toolfleet.settings import FleetSettings

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

AGENT = "did:agent:e2e"
TENANT = "t1"
VALUE = f"tf-e2e-{secrets.token_hex(20)}"
NEEDLES = [form.encode() for form in encodings(VALUE)]


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[Fleet, ProcessFleet]]:
    home: Path = tmp_path_factory.mktemp("e2e-secrets")
    local = fleet_settings(settings, home)
    async with process_fleet(
        local,
        home,
        TOOLFLEET_LOG_LEVEL="DEBUG",
        TOOLFLEET_SECRET_BACKEND="env",
        TOOLFLEET_SECRET__T1__CONN1__API_KEY=VALUE,
    ) as running:
        yield running


async def _call(running: Fleet, tool_id: str, **params: str) -> ToolOutcome:
    return await running.client.call(
        tool_id,
        dict(params),
        tenant_id=TENANT,
        agent_did=AGENT,
        capability_token=running.token(TENANT, AGENT, connections=["conn1"]),
        connection_id="conn1",
        timeout=60,
    )


def _found(blob: bytes) -> bool:
    return any(needle in blob for needle in NEEDLES)


async def _raw_messages(running: Fleet) -> list[tuple[str, bytes]]:
    """Every message of every topic of this fleet, as (topic, key + headers + value)."""
    consumer = AIOKafkaConsumer(
        **connection_kwargs(running.settings),
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    try:
        topics = sorted(
            t for t in await consumer.topics() if t.startswith(running.settings.topic_prefix)
        )
        consumer.subscribe(topics)
        found: list[tuple[str, bytes]] = []
        while True:
            batch = await consumer.getmany(timeout_ms=1000)
            if not batch and consumer.assignment():
                break
            for records in batch.values():
                for r in records:
                    blob = b"\n".join(
                        [r.key or b"", r.value or b"", *(k.encode() + v for k, v in r.headers)]
                    )
                    found.append((r.topic, blob))
        return found
    finally:
        await consumer.stop()


async def _database_rows(database_url: str) -> dict[str, list[str]]:
    """Every value of every row of every table, as text, by table."""
    conn = await asyncpg.connect(database_url)
    try:
        tables = await conn.fetch(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_type = 'BASE TABLE' "
            "AND table_schema NOT IN ('pg_catalog', 'information_schema')"
        )
        dump: dict[str, list[str]] = {}
        for t in tables:
            name = f'"{t["table_schema"]}"."{t["table_name"]}"'
            rows = await conn.fetch(f"SELECT * FROM {name}")  # noqa: S608 - catalog names
            dump[name] = [str(value) for row in rows for value in row.values()]
        return dump
    finally:
        await conn.close()


async def test_the_secret_never_leaves_the_executor(fleet: tuple[Fleet, ProcessFleet]) -> None:
    running, procs = fleet

    used = await _call(running, "test__secret_user")
    assert used.status is InvocationStatus.SUCCESS, (used.error, procs.logs())
    assert used.result is not None
    assert used.result["length"] == len(VALUE)
    leaks = {
        how: await _call(running, "test__secret_leaker", how=how)
        for how in ("raw", "base64", "error", "checkpoint")
    }
    for how, outcome in leaks.items():
        assert outcome.error is not None, how
        assert outcome.error.code == "redaction_failed", (how, outcome.error)
    invocation_ids = [str(used.invocation_id)] + [str(o.invocation_id) for o in leaks.values()]

    # Let audit and status catch up with every invocation before searching.
    async def projected() -> bool:
        conn = await asyncpg.connect(running.settings.database_url)
        try:
            count = await conn.fetchval(
                "SELECT count(*) FROM tool_invocations WHERE invocation_id = ANY($1::uuid[]) "
                "AND status IN ('success', 'error')",
                invocation_ids,
            )
        finally:
            await conn.close()
        return bool(count == len(invocation_ids))

    async def audited() -> bool:
        records = await running.read(TopicName.AUDIT)
        seen = {r.invocationid for r in records if r.type.endswith((".succeeded", ".failed"))}
        return set(invocation_ids) <= seen

    await eventually(projected, timeout=60)
    await eventually(audited, timeout=60)

    messages = await _raw_messages(running)
    topics = {topic for topic, _ in messages}
    assert running.topic(TopicName.RESULTS) in topics
    assert running.topic(TopicName.AUDIT) in topics
    assert [topic for topic, blob in messages if _found(blob)] == []

    logs = sorted(procs.log_dir.glob("*.log"))
    assert {p.name.split("-")[0] for p in logs} >= set(ALL_SERVICES)
    assert [p.name for p in logs if _found(p.read_bytes())] == []

    dump = await _database_rows(running.settings.database_url)
    assert any("tool_invocations" in name for name in dump)
    assert [name for name, values in dump.items() if any(_found(v.encode()) for v in values)] == []

    # The search sees what it must: the fingerprint the tool derived is on the results
    # topic and in the status projection, found by the same kind of scan.
    fingerprint = hashlib.sha256(VALUE.encode()).hexdigest()[:12]
    assert used.result["fingerprint"] == fingerprint
    assert any(fingerprint.encode() in blob for _, blob in messages)
    assert any(fingerprint in v for values in dump.values() for v in values)
    assert _found(f"planted {VALUE}".encode())
