"""What the analytics app would write, for tests of the API's analytics routes."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime

from redis.asyncio import Redis

from toolfleet.analytics.detectors import DetectorSettings
from toolfleet.analytics.engine import Analyzer, memory_tables
from toolfleet.analytics.facts import AuditFact
from toolfleet.analytics.snapshot import RedisSnapshots, build_snapshots
from toolfleet.events.types import EventType
from toolfleet.settings import FleetSettings


async def write_snapshots(
    settings: FleetSettings, calls: Mapping[str, int], *, now: datetime
) -> None:
    """Write to Redis the snapshots the analytics app writes after counting ``calls``
    requested calls of each tenant (tenant -> calls) at ``now``."""
    engine = Analyzer(memory_tables(), settings=DetectorSettings())
    for tenant, count in calls.items():
        for _ in range(count):
            engine.observe(
                AuditFact(
                    audit_id=str(uuid.uuid4()),
                    tenant_id=tenant,
                    at=now.timestamp(),
                    event_type=EventType.INVOKE_REQUESTED,
                    agent_did="did:agent:a",
                    tool_id="core__echo",
                )
            )
    snaps = build_snapshots(
        minute=engine.tables.minute, hour=engine.tables.hour, anomalies={}, now=now
    )
    redis = Redis.from_url(settings.redis_url)
    try:
        await RedisSnapshots(redis).write(snaps.values())
    finally:
        await redis.aclose()
