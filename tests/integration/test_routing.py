"""Every service subscribes to exactly what the routing table (and so the AsyncAPI
document) says: its handler, built as a worker builds it, yields one consumer per row."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.pipeline import fleet_settings
from toolfleet.events.routing import ROUTING
from toolfleet.events.types import topic
from toolfleet.settings import FleetSettings
from toolfleet.worker import SERVICES, load_build, open_resources

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.mark.parametrize("service", SERVICES)
async def test_the_handlers_consumers_are_its_rows_of_the_routing_table(
    service: str, settings: FleetSettings, tmp_path: Path
) -> None:
    local = fleet_settings(settings, tmp_path)
    prefix = local.topic_prefix
    party = next(p for p in ROUTING if p.name == service)
    async with open_resources(local, service=service) as res:
        consumers = await load_build(service)(res)
        expected = {
            (
                row.name,
                party.source,
                f"{prefix}{row.group}-{res.worker_id}"
                if row.per_worker
                else f"{prefix}{row.group}",
                tuple(topic(prefix, name) for name in row.topics),
                "latest" if row.from_latest else "earliest",
            )
            for row in party.consumers
        }
    built = {
        (
            c.spec.service,
            c.spec.source,
            c.spec.group_id,
            tuple(c.spec.topics),
            c.spec.auto_offset_reset,
        )
        for c in consumers
    }
    assert len(consumers) == len(party.consumers)
    assert built == expected
