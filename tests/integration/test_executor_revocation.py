"""A token revoked between authorization and execution runs nothing (real broker, Redis)."""

from __future__ import annotations

from pathlib import Path

import jwt
import pytest

from tests.support.eventually import eventually
from tests.support.pipeline import Fleet, fleet_settings, in_process_fleet, running_services
from toolfleet.client import InvocationHandle
from toolfleet.events.models import InvocationStatus
from toolfleet.events.types import EventType, TopicName
from toolfleet.executor.registration import register_catalog
from toolfleet.registry.catalog import discover
from toolfleet.settings import FleetSettings
from toolfleet.storage.postgres import create_pool
from toolfleet.storage.redis import connect_redis
from toolfleet.storage.revocation import RedisRevocationList

pytestmark = pytest.mark.integration

AGENT = "did:agent:revoked-later"
TENANT = "t_revoked_later"


async def authorized(fleet: Fleet, token: str, message: str) -> InvocationHandle:
    """Invoke and return once policy has authorized the call (and minted its grant)."""
    handle = await fleet.client.invoke(
        "core__echo",
        {"message": message},
        tenant_id=TENANT,
        agent_did=AGENT,
        capability_token=token,
    )

    async def granted() -> bool:
        events = await fleet.read(TopicName.AUTHORIZED, invocation_id=handle.invocation_id)
        return any(e.data and e.data.get("grant") for e in events)

    await eventually(granted, timeout=30)
    return handle


async def test_the_executor_refuses_a_grant_whose_token_was_revoked_after_authorization(
    settings: FleetSettings, tmp_path: Path
) -> None:
    home = fleet_settings(settings, tmp_path)
    pool = await create_pool(home.database_url)
    try:  # what an executor registers at start, before it was paused
        await register_catalog(pool, discover(home.tool_module_list))
    finally:
        await pool.close()
    # No executor running: authorized calls wait on the topic, as behind a paused one.
    async with in_process_fleet(home, services=("policy", "validator")) as fleet:
        revoked_token, kept_token = fleet.token(TENANT, AGENT), fleet.token(TENANT, AGENT)
        doomed = await authorized(fleet, revoked_token, "authorized, then revoked")
        kept = await authorized(fleet, kept_token, "authorized and still valid")

        redis = connect_redis(fleet.settings.redis_url)
        try:
            jti = jwt.decode(revoked_token, options={"verify_signature": False})["jti"]
            await RedisRevocationList(redis).revoke(jti, ttl_s=600)
        finally:
            await redis.aclose()

        async with running_services(fleet.settings, ["executor"]):
            refused = await fleet.client.wait(doomed, timeout=30)
            ran = await fleet.client.wait(kept, timeout=30)

        assert refused.status is InvocationStatus.PERMISSION_DENIED
        assert refused.error is not None
        assert refused.error.code == "permission_denied"
        assert "revoked" in refused.error.message
        assert ran.status is InvocationStatus.SUCCESS
        assert ran.result is not None
        assert ran.result["message"] == "authorized and still valid"
        # The refused call never started: no `invoked` event, so the tool did not run.
        events = await fleet.read(TopicName.EVENTS, invocation_id=doomed.invocation_id)
        assert EventType.INVOKED not in {e.type for e in events}
        started = await fleet.read(TopicName.EVENTS, invocation_id=kept.invocation_id)
        assert EventType.INVOKED in {e.type for e in started}
