"""Result rules through the fleet, and raw results sealed at rest.

Policy, executor, validator and audit in-process against the real broker, Redis and
Postgres. The hostile corpus of ``tests.support.hostile_results`` runs through each
mode's tool; the audit topic names each finding's rule and field, never the value; the
raw bytes of transfer blobs (Postgres) and cache entries (Redis) hold no plaintext.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from tests.support import hostile_results as hostile
from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.events.types import TopicName
from toolfleet.executor.cache import cache_key, call_id
from toolfleet.settings import FleetSettings
from toolfleet.storage.at_rest import MAGIC, TRANSFER_BLOB, AtRestCipher
from toolfleet.storage.blobs import PostgresBlobStore

pytestmark = pytest.mark.integration

TENANT = "t_results"
AGENT = "did:agent:results"


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("result-validation")
    local = fleet_settings(
        settings,
        home,
        tool_modules="tests.support.sample_tools,tests.support.hostile_results",
        result_inline_bytes=64 * 1024,
        max_result_blob_bytes=4 * 1024 * 1024,
    )
    async with in_process_fleet(local, ("policy", "executor", "validator", "audit")) as running:
        yield running


@pytest.fixture(scope="module")
async def pool(fleet: Fleet) -> AsyncIterator[asyncpg.Pool]:
    connections = await asyncpg.create_pool(fleet.settings.database_url, min_size=1, max_size=2)
    assert connections is not None
    try:
        yield connections
    finally:
        await connections.close()


async def call(fleet: Fleet, mode: str, params: dict[str, Any]) -> ToolOutcome:
    return await fleet.client.call(
        f"test__report_{mode}",
        params,
        tenant_id=TENANT,
        agent_did=AGENT,
        capability_token=fleet.token(TENANT, AGENT),
        timeout=60,
    )


@pytest.mark.parametrize("mode", hostile.MODES)
async def test_the_hostile_corpus_per_mode(fleet: Fleet, mode: str) -> None:
    outcomes = await asyncio.gather(
        *(call(fleet, mode, {"result": {"body": case.body}}) for case in hostile.CORPUS)
    )
    for case, outcome in zip(hostile.CORPUS, outcomes, strict=True):
        want = hostile.expected(case, mode)
        if want is None:
            assert outcome.error is not None, case.name
            assert outcome.error.code == "result_sanitization_rejected", case.name
            found = {(f["rule"], f["field"]) for f in outcome.error.details["findings"]}
            assert found == {(r, "$.body") for r in case.rules}, case.name
        else:
            assert outcome.status is InvocationStatus.SUCCESS, (case.name, outcome.error)
            assert outcome.result is not None
            assert outcome.result["body"] == want, case.name


async def test_coerce_mode_and_typed_failures(fleet: Fleet) -> None:
    coerced = await call(fleet, "escape", {"result": {"count": "42", "tags": "solo"}})
    assert coerced.status is InvocationStatus.SUCCESS, coerced.error
    assert coerced.result is not None
    assert (coerced.result["count"], coerced.result["tags"]) == (42, ["solo"])
    assert coerced.warnings == [
        "result coerced at $.count: string to integer",
        "result coerced at $.tags: string to array",
    ]
    strict = await call(fleet, "strict", {"result": {"count": "42"}})
    impossible = await call(fleet, "escape", {"result": {"count": "many"}})
    deep = await call(fleet, "reject", {"result": {}, "depth": 80})
    huge = await call(fleet, "escape", {"result": {"body": "x"}, "body_bytes": 1_200_000})
    codes = [o.error.code if o.error else None for o in (strict, impossible, deep, huge)]
    assert codes == [
        "result_validation_failed",
        "result_coercion_failed",
        "result_too_large",
        "result_too_large",
    ]
    assert all(o.error is not None and not o.error.retryable for o in (strict, impossible, deep))


async def test_findings_are_audited_by_rule_and_field_never_by_value(fleet: Fleet) -> None:
    marker = f"<script>steal('{uuid.uuid4().hex}')</script>"
    rejected = await call(fleet, "reject", {"result": {"title": marker}})
    escaped = await call(fleet, "escape", {"result": {"title": marker}})
    assert rejected.error is not None
    assert escaped.status is InvocationStatus.SUCCESS

    async def audited(outcome: ToolOutcome, kind: str) -> dict[str, Any]:
        events = await fleet.read(TopicName.AUDIT, invocation_id=str(outcome.invocation_id))
        [event] = [e for e in events if e.type == f"ai.agent.tool.{kind}"]
        return event.data

    failed = await eventually(lambda: audited(rejected, "failed"))
    succeeded = await eventually(lambda: audited(escaped, "succeeded"))
    for data in (failed, succeeded):
        text = json.dumps(data)
        assert "html.script" in text
        assert "$.title" in text
        assert "steal" not in text
        assert marker not in text


async def test_transfer_blobs_hold_no_plaintext(fleet: Fleet, pool: asyncpg.Pool) -> None:
    secret = f"secret-{uuid.uuid4().hex}"
    outcome = await call(
        fleet, "escape", {"result": {"body": f"{secret}<b onclick=x()>"}, "body_bytes": 200_000}
    )
    assert outcome.status is InvocationStatus.SUCCESS, outcome.error
    assert outcome.execution_metadata.truncated  # the validator read the transfer blob
    assert "result field $.body: html.event_handler escaped" in outcome.warnings
    rows = await pool.fetch(
        "SELECT purpose, data FROM result_blobs WHERE invocation_id = $1",
        outcome.invocation_id,
    )
    raw = {row["purpose"]: bytes(row["data"]) for row in rows}
    assert raw["transfer"].startswith(MAGIC)
    assert secret.encode() not in raw["transfer"]
    assert b"aaaaaaaa" not in raw["transfer"]
    # The attachment is the validated, escaped result: stored as clients may see it.
    assert b"&lt;b onclick" in raw["attachment"]


async def test_a_plaintext_transfer_blob_from_before_the_upgrade_still_reads(
    fleet: Fleet, pool: asyncpg.Pool
) -> None:
    assert fleet.settings.grant_key_file is not None
    invocation = str(uuid.uuid4())
    blob_id = await PostgresBlobStore(pool).put(
        b'{"body":"old"}', tenant_id=TENANT, invocation_id=invocation, purpose="transfer"
    )
    cipher = AtRestCipher.from_settings(fleet.settings, purpose=TRANSFER_BLOB)
    blob = await PostgresBlobStore(pool, cipher=cipher).get(
        blob_id, purpose="transfer", tenant_id=TENANT
    )
    assert blob is not None
    assert blob.data == b'{"body":"old"}'


async def test_cache_entries_hold_no_plaintext(fleet: Fleet) -> None:
    params = {"key": uuid.uuid4().hex}
    outcomes = [
        await fleet.client.call(
            "test__cached",
            params,
            tenant_id=TENANT,
            agent_did=AGENT,
            capability_token=fleet.token(TENANT, AGENT),
            timeout=60,
        )
        for _ in range(2)
    ]
    assert [o.result for o in outcomes] == [{"value": 1}, {"value": 1}]
    assert outcomes[1].execution_metadata.cached
    key = cache_key(
        call_id(tool_id="test__cached", tool_version="1.0.0", parameters=params, tenant_id=TENANT)
    )
    redis = Redis.from_url(fleet.settings.redis_url)
    try:
        raw = await redis.get(key)
    finally:
        await redis.aclose()
    assert isinstance(raw, bytes)
    assert raw.startswith(MAGIC)
    assert b"value" not in raw
