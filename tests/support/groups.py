"""What the broker says of a consumer group (DescribeGroups)."""

from __future__ import annotations

from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from tests.support.eventually import eventually
from toolfleet.bus.connection import connection_kwargs
from toolfleet.settings import FleetSettings


async def group_formed(
    settings: FleetSettings,
    group: str,
    *,
    members: int,
    timeout: float = 30,
    stable: bool = False,
) -> dict[str, Any]:
    """Until the broker counts ``members`` members (or more) in ``group``; with
    ``stable``, also until its rebalance is over (state ``Stable``). Returns the group as
    the broker described it."""
    admin = AIOKafkaAdminClient(**connection_kwargs(settings))
    await admin.start()
    try:

        async def formed() -> dict[str, Any] | None:
            [described] = await admin.describe_consumer_groups([group])
            [entry] = described.to_object()["groups"]
            if len(entry["members"]) < members:
                return None
            return entry if not stable or entry["state"] == "Stable" else None

        return await eventually(formed, timeout=timeout, interval=0.02)
    finally:
        await admin.close()
