"""Issue-3 behaviour through the real pipeline: what a client sees for each rule."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import jwt
import pytest

from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet
from toolfleet.client.requests import invoke_request
from toolfleet.events.identity import CallRef
from toolfleet.events.models import InvocationStatus, ResourceLimits, ToolOutcome
from toolfleet.policy.cache import RedisPolicyCache
from toolfleet.policy.documents import TenantPolicy
from toolfleet.policy.postgres_policies import PolicyStore
from toolfleet.settings import FleetSettings
from toolfleet.storage.postgres import create_pool
from toolfleet.storage.redis import connect_redis
from toolfleet.storage.revocation import RedisRevocationList

pytestmark = pytest.mark.integration

AGENT = "did:agent:policy"
POLICY: dict[str, Any] = {
    "tenants": {
        "*": {"allow_tools": ["core__*", "test__*"]},
        "p_rate": {"allow_tools": ["core__*"], "budgets": {"max_calls_per_minute": 3}},
        "p_budget": {"allow_tools": ["core__*"], "budgets": {"max_runtime_ms": 300}},
        "p_expiry": {
            "allow_tools": ["test__*"],
            "approval_effects": ["external_side_effect"],
            "approval_ttl_s": 1,
        },
        "p_live": {"allow_tools": ["core__*"]},
        "p_conc": {"allow_tools": ["core__*"], "max_concurrent_per_agent": 2},
        "p_small": {"allow_tools": ["core__*"], "budgets": {"max_result_bytes": 64}},
    }
}


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("policy")
    async with in_process_fleet(fleet_settings(settings, home, policy=POLICY)) as running:
        yield running


async def call(
    fleet: Fleet,
    tool: str,
    params: dict[str, Any],
    *,
    tenant: str,
    token: str | None = None,
    **kw: Any,
) -> ToolOutcome:
    return await fleet.client.call(
        tool,
        params,
        tenant_id=tenant,
        agent_did=AGENT,
        capability_token=token or fleet.token(tenant, AGENT),
        timeout=30,
        **kw,
    )


async def test_rate_limit_per_tenant(fleet: Fleet) -> None:
    outcomes = [
        await call(fleet, "core__echo", {"message": str(i)}, tenant="p_rate") for i in range(4)
    ]
    assert [o.status for o in outcomes[:3]] == [InvocationStatus.SUCCESS] * 3
    refused = outcomes[3]
    assert refused.error is not None
    assert refused.error.code == "rate_limit_exceeded"
    assert refused.error.retryable
    assert refused.error.retry_after_s is not None
    assert 0 < refused.error.retry_after_s <= 20


async def test_idempotency_key_returns_the_first_outcome(fleet: Fleet) -> None:
    first = await call(fleet, "core__echo", {"message": "once"}, tenant="t1", idempotency_key="k-1")
    again = await call(fleet, "core__echo", {"message": "once"}, tenant="t1", idempotency_key="k-1")
    assert again.status is InvocationStatus.SUCCESS
    assert again.result == first.result
    assert again.invocation_id != first.invocation_id
    other = await call(
        fleet, "core__echo", {"message": "twice"}, tenant="t1", idempotency_key="k-1"
    )
    assert other.error is not None
    assert other.error.code == "idempotency_conflict"
    # the key is per tenant: another tenant may use it
    mine = await call(fleet, "core__echo", {"message": "twice"}, tenant="t2", idempotency_key="k-1")
    assert mine.status is InvocationStatus.SUCCESS


async def test_duplicate_of_a_running_call_waits_for_its_outcome(fleet: Fleet) -> None:
    params = {"steps": 3, "step_seconds": 0.2}
    token = fleet.token("t1", AGENT)
    first = await fleet.client.invoke(
        "core__long_running",
        params,
        tenant_id="t1",
        agent_did=AGENT,
        capability_token=token,
        idempotency_key="k-long",
    )
    second = await fleet.client.invoke(
        "core__long_running",
        params,
        tenant_id="t1",
        agent_did=AGENT,
        capability_token=token,
        idempotency_key="k-long",
    )
    a, b = await asyncio.gather(
        fleet.client.wait(first, timeout=30), fleet.client.wait(second, timeout=30)
    )
    assert a.status is b.status is InvocationStatus.SUCCESS
    assert a.result == b.result == {"steps_completed": 3, "resumed_from_step": None}
    assert len(a.execution_metadata.checkpoints_created) == 3  # it ran once


async def test_runtime_budget_caps_the_timeout(fleet: Fleet) -> None:
    outcome = await call(
        fleet, "core__long_running", {"steps": 5, "step_seconds": 0.2}, tenant="p_budget"
    )
    assert outcome.status is InvocationStatus.TIMEOUT


async def test_revoked_token_is_denied(fleet: Fleet) -> None:
    token = fleet.token("t1", AGENT)
    assert (await call(fleet, "core__echo", {"message": "a"}, tenant="t1", token=token)).status is (
        InvocationStatus.SUCCESS
    )
    redis = connect_redis(fleet.settings.redis_url)
    try:
        jti = jwt.decode(token, options={"verify_signature": False})["jti"]
        await RedisRevocationList(redis).revoke(jti, ttl_s=600)
    finally:
        await redis.aclose()
    outcome = await call(fleet, "core__echo", {"message": "b"}, tenant="t1", token=token)
    assert outcome.status is InvocationStatus.PERMISSION_DENIED
    assert outcome.error is not None
    assert "revoked" in outcome.error.message


async def test_connection_must_be_granted_by_the_token(fleet: Fleet) -> None:
    denied = await call(
        fleet, "core__echo", {"message": "x"}, tenant="t1", connection_id="github-prod"
    )
    assert denied.status is InvocationStatus.PERMISSION_DENIED
    assert denied.error is not None
    assert "connection" in denied.error.message
    token = fleet.issuer.issue(tenant_id="t1", agent_did=AGENT, connections=["github-prod"])
    allowed = await call(
        fleet, "core__echo", {"message": "x"}, tenant="t1", token=token, connection_id="github-prod"
    )
    assert allowed.status is InvocationStatus.SUCCESS


async def test_unanswered_approval_expires_as_approval_denied(fleet: Fleet) -> None:
    outcome = await call(fleet, "test__sleep", {"seconds": 0}, tenant="p_expiry")
    assert outcome.status is InvocationStatus.PERMISSION_DENIED
    assert outcome.error is not None
    assert outcome.error.code == "approval_denied"
    assert "expired" in outcome.error.message


async def test_policy_change_takes_effect_without_waiting_for_the_cache_ttl(fleet: Fleet) -> None:
    assert (await call(fleet, "core__echo", {"message": "1"}, tenant="p_live")).status is (
        InvocationStatus.SUCCESS
    )
    pool = await create_pool(fleet.settings.database_url)
    redis = connect_redis(fleet.settings.redis_url)
    try:
        await PolicyStore(pool).put("p_live", TenantPolicy(allow_tools=["core__get_*"]), "test")
        await RedisPolicyCache(redis).announce("p_live")
    finally:
        await pool.close()
        await redis.aclose()

    async def denied() -> bool:
        outcome = await call(fleet, "core__echo", {"message": "2"}, tenant="p_live")
        return outcome.status is InvocationStatus.PERMISSION_DENIED

    # Policy decisions are cached for 300 s: a denial well before that came through the
    # `policy:updates` push. How fast it is, bench/ measures.
    await eventually(denied, timeout=15, interval=0.1)


async def _publish_authorized(fleet: Fleet, data: dict[str, Any]) -> ToolOutcome:
    from toolfleet.bus.producer import Outbound
    from toolfleet.events.envelope import new_event
    from toolfleet.events.types import EventType, Source, TopicName

    invocation_id = data["invocation_id"]
    envelope = new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data=data,
        tenant_id="t1",
        invocation_id=invocation_id,
    )
    handle = fleet.client.expect(invocation_id, tenant_id="t1")
    await fleet.producer.send(Outbound(envelope=envelope, topic=fleet.topic(TopicName.AUTHORIZED)))
    return await fleet.client.wait(handle, timeout=30)


def _authorized(**over: Any) -> dict[str, Any]:
    import uuid
    from datetime import UTC, datetime

    return {
        "invocation_id": str(uuid.uuid4()),
        "tool_id": "core__echo",
        "tool_version": "1.0.0",
        "requested_version": "*",
        "agent_context": {"agent_did": AGENT, "tenant_id": "t1"},
        "parameters": {"message": "forged"},
        "effect": "read_only",
        "timeout_seconds": 5,
        "requested_at": datetime.now(UTC).isoformat(),
        **over,
    }


async def test_an_authorized_event_without_a_grant_runs_nothing(fleet: Fleet) -> None:
    outcome = await _publish_authorized(fleet, _authorized())
    assert outcome.status is InvocationStatus.PERMISSION_DENIED
    assert outcome.error is not None
    assert "grant" in outcome.error.message


async def test_a_grant_does_not_cover_altered_parameters(fleet: Fleet) -> None:
    from toolfleet.auth.grants import GrantSigner

    assert fleet.settings.grant_key_file is not None
    signer = GrantSigner.from_settings(fleet.settings)
    assert signer is not None
    data = _authorized()
    grant = signer.sign(
        call=CallRef(
            invocation_id=data["invocation_id"],
            tenant_id="t1",
            agent_did=AGENT,
            tool_id="core__echo",
            tool_version="1.0.0",
        ),
        parameters={"message": "harmless"},
        capability_jti="j",
        timeout_s=5,
    )
    altered = await _publish_authorized(fleet, {**data, "grant": grant})
    assert altered.status is InvocationStatus.PERMISSION_DENIED
    honest = _authorized(parameters={"message": "harmless"})
    honest_grant = signer.sign(
        call=CallRef(
            invocation_id=honest["invocation_id"],
            tenant_id="t1",
            agent_did=AGENT,
            tool_id="core__echo",
            tool_version="1.0.0",
        ),
        parameters={"message": "harmless"},
        capability_jti="j",
        timeout_s=5,
    )
    ran = await _publish_authorized(fleet, {**honest, "grant": honest_grant})
    assert ran.status is InvocationStatus.SUCCESS


async def test_result_budget(fleet: Fleet) -> None:
    outcome = await call(fleet, "core__echo", {"message": "x" * 200}, tenant="p_small")
    assert outcome.error is not None
    assert outcome.error.code == "resource_exhausted"
    assert outcome.error.details["budget"] == 64
    assert (await call(fleet, "core__echo", {"message": "ok"}, tenant="p_small")).status is (
        InvocationStatus.SUCCESS
    )


async def test_calls_past_the_agent_concurrency_limit_wait(fleet: Fleet) -> None:
    token = fleet.token("p_conc", AGENT)
    handles = [
        await fleet.client.invoke(
            "core__long_running",
            {"steps": 2, "step_seconds": 0.15},
            tenant_id="p_conc",
            agent_did=AGENT,
            capability_token=token,
        )
        for _ in range(5)
    ]
    outcomes = await asyncio.gather(*(fleet.client.wait(h, timeout=60) for h in handles))
    assert all(o.status is InvocationStatus.SUCCESS for o in outcomes)  # waited, not failed
    spans = [(o.execution_metadata.started_at, o.execution_metadata.completed_at) for o in outcomes]
    edges = sorted(
        [(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1])
    )
    running, peak = 0, 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    assert peak == 2


async def test_an_approval_binds_to_the_exact_request(fleet: Fleet) -> None:
    from toolfleet.client import Progress
    from toolfleet.policy.service import parameters_hash

    seen: list[Progress] = []
    params = {"message": "pay 10 EUR"}
    handle = await fleet.client.invoke(
        "core__echo",
        params,
        tenant_id="t1",
        agent_did=AGENT,
        capability_token=fleet.token("t1", AGENT),
        require_approval=True,
    )
    waiting = asyncio.create_task(fleet.client.wait(handle, timeout=30, on_progress=seen.append))

    async def parked() -> bool:
        return any(p.event_type == "ai.agent.tool.approval.requested" for p in seen)

    await eventually(parked)
    reviewed_other = parameters_hash("core__echo", "1.0.0", {"message": "pay 1000 EUR"})
    await fleet.client.approve(
        handle.invocation_id, tenant_id="t1", approver="alice", parameters_hash=reviewed_other
    )
    await asyncio.sleep(0.5)  # bounded: proving the stale approval did nothing
    assert not waiting.done()
    exact = parameters_hash("core__echo", "1.0.0", params)
    await fleet.client.approve(
        handle.invocation_id, tenant_id="t1", approver="alice", parameters_hash=exact
    )
    outcome = await waiting
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result == {"message": "pay 10 EUR", "length": 10}


@pytest.mark.parametrize(
    ("asked", "limit", "allowed"),
    [
        ({"memory_mb_limit": 8192}, "memory_mb_limit", 512),  # the fleet's default
        ({"cpu_millicore_limit": 64_000}, "cpu_millicore_limit", 1000),
        ({"timeout_seconds": 3600}, "timeout_seconds", 5),  # core__echo's manifest
    ],
)
async def test_resource_limits_may_lower_never_raise_the_manifests_and_fleets(
    fleet: Fleet, asked: dict[str, float], limit: str, allowed: float
) -> None:
    """Issue 32, attack 6: a request above the limits ran under them; now it is refused
    before it runs, naming the limit, while a lower ask runs."""

    async def outcome(**limits: float) -> ToolOutcome:
        request = invoke_request(
            "core__echo",
            {"message": "limits"},
            tenant_id="t1",
            agent_did=AGENT,
            capability_token=fleet.token("t1", AGENT),
        )
        request = request.model_copy(update={"resource_limits": ResourceLimits(**limits)})
        return await fleet.client.wait(await fleet.client.publish(request), timeout=30)

    refused = await outcome(**asked)
    assert refused.error is not None, refused.status
    assert refused.error.code == "resource_exhausted"
    assert refused.error.retryable is False
    assert refused.error.details == {"limit": limit, "asked": asked[limit], "allowed": allowed}
    assert limit in refused.error.message
    lower = await outcome(memory_mb_limit=128, cpu_millicore_limit=500, timeout_seconds=2)
    assert lower.status is InvocationStatus.SUCCESS


async def test_a_policy_worker_without_a_policy_file_keeps_running(
    settings: FleetSettings, tmp_path: Path
) -> None:
    """A background job that returns ends its worker (``serve``); the policy file's
    watcher, with no file to watch, returned at once, so ``toolfleet worker policy``
    without ``TOOLFLEET_POLICY_FILE`` stopped right after it started."""
    from toolfleet.worker import load_build, open_resources, serve

    local = fleet_settings(settings, tmp_path, policy_file=None)
    assert local.policy_file is None
    async with open_resources(local, service="policy") as res:
        consumers = await load_build("policy")(res)
        stop = asyncio.Event()
        served = asyncio.create_task(serve(consumers, stop, res.jobs))
        try:
            await asyncio.wait_for(
                asyncio.gather(*(c.assigned.wait() for c in consumers)), timeout=60
            )
            done, _ = await asyncio.wait({served}, timeout=1.5)
            assert not done, "the policy worker stopped by itself"
        finally:
            stop.set()
            await asyncio.wait_for(served, timeout=30)
