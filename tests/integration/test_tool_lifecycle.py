"""Issue 14, lifecycle end to end: an operator deprecates, sunsets and removes a version
through the API; callers see the warning, then ``tool_removed``; a tenant pinning the
version keeps it past sunset; audit records the operator of every change."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaConsumer

from tests.support.eventually import eventually
from tests.support.pipeline import DEFAULT_POLICY, Fleet, fleet_settings, in_process_fleet
from toolfleet.api import ApiSettings, create_app
from toolfleet.bus.connection import connection_kwargs
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.events.types import EventType, TopicName
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration

AGENT = "did:agent:lifecycle"
OPERATOR = "did:operator:ops-alice"
POLICY: dict[str, Any] = {
    "tenants": {
        **DEFAULT_POLICY["tenants"],
        "lc_free": {"allow_tools": ["lc__*"]},
        "lc_pinned": {"allow_tools": ["lc__*"], "tool_versions": {"lc__report": "1.0.0"}},
    }
}


@pytest.fixture(scope="module")
async def fleet(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Fleet]:
    home: Path = tmp_path_factory.mktemp("lifecycle")
    configured = fleet_settings(
        settings,
        home,
        policy=POLICY,
        tool_modules="tests.support.sample_tools,tests.support.lifecycle_tools",
    )
    with pytest.MonkeyPatch.context() as env:
        # Policy re-reads the registry on every call: each change shows on the next call.
        env.setenv("TOOLFLEET_REGISTRY_CACHE_TTL_S", "0")
        async with in_process_fleet(
            configured, ("policy", "executor", "validator", "audit")
        ) as running:
            yield running


@pytest.fixture(scope="module")
async def api(fleet: Fleet) -> AsyncIterator[httpx.AsyncClient]:
    application = create_app(ApiSettings(**fleet.settings.model_dump()))
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://api.test") as client:
            yield client


def admin(fleet: Fleet) -> dict[str, str]:
    token = fleet.issuer.issue(tenant_id="lc_ops", agent_did=OPERATOR, scopes=["admin"])
    return {"Authorization": f"Bearer {token}"}


async def call(fleet: Fleet, tenant: str, version: str) -> ToolOutcome:
    return await fleet.client.call(
        "lc__report",
        {},
        tenant_id=tenant,
        agent_did=AGENT,
        capability_token=fleet.token(tenant, AGENT),
        tool_version=version,
        timeout=30,
    )


async def patch(api: httpx.AsyncClient, fleet: Fleet, body: dict[str, Any]) -> httpx.Response:
    return await api.patch("/v1/tools/lc__report/versions/1.0.0", json=body, headers=admin(fleet))


async def test_deprecate_warn_sunset_remove_with_a_pin_and_an_audit_trail(
    fleet: Fleet, api: httpx.AsyncClient
) -> None:
    before = await call(fleet, "lc_free", "1.0.0")
    assert before.status is InvocationStatus.SUCCESS
    assert before.warnings == []

    # Deprecate: calls still run, and say what to use instead and until when.
    sunset_on = (datetime.now(UTC) + timedelta(days=30)).replace(microsecond=0)
    deprecated = await patch(
        api,
        fleet,
        {
            "lifecycle_state": "deprecated",
            "deprecated_in_favor_of": "2.0.0",
            "sunset_date": sunset_on.isoformat(),
        },
    )
    assert deprecated.status_code == 200, deprecated.text
    assert deprecated.json()["previous_state"] == "active"
    assert deprecated.json()["changed_by"] == OPERATOR
    warned = await call(fleet, "lc_free", "1.0.0")
    assert warned.status is InvocationStatus.SUCCESS
    assert warned.result == {"value": 1}
    assert warned.warnings == [
        f"tool lc__report@1.0.0 is deprecated; use 2.0.0; sunset on {sunset_on.date()}"
    ]
    listed = (await api.get("/v1/tools", params={"category": "data"}, headers=admin(fleet))).json()
    report = next(t for t in listed["items"] if t["tool_id"] == "lc__report")
    assert report["latest_version"] == "2.0.0"
    assert [(v["version"], v["deprecated"]) for v in report["versions"]] == [
        ("2.0.0", False),
        ("1.0.0", True),
    ]

    # Sunset: only a tenant whose policy pins 1.0.0 still runs it.
    sunset = await patch(api, fleet, {"lifecycle_state": "sunset"})
    assert sunset.status_code == 200, sunset.text
    assert sunset.json()["lifecycle_state"] == "sunset"
    refused = await call(fleet, "lc_free", "1.0.0")
    assert refused.status is InvocationStatus.ERROR
    assert refused.error is not None
    assert refused.error.code == "tool_removed"
    assert "use 2.0.0" in refused.error.message
    assert (await call(fleet, "lc_free", "*")).tool_version == "2.0.0"
    pinned = await call(fleet, "lc_pinned", "1.0.0")
    assert pinned.status is InvocationStatus.SUCCESS
    assert "pins it" in pinned.warnings[0]

    # Going back is refused; only an admin may change anything.
    backwards = await patch(api, fleet, {"lifecycle_state": "deprecated"})
    assert backwards.status_code == 409
    assert backwards.json()["code"] == "state_conflict"
    agent_token = fleet.token("lc_free", AGENT)
    forbidden = await api.patch(
        "/v1/tools/lc__report/versions/1.0.0",
        json={"lifecycle_state": "removed"},
        headers={"Authorization": f"Bearer {agent_token}"},
    )
    assert forbidden.status_code == 403

    # Removed: never runs, pinned or not, and leaves the lists.
    removed = await patch(api, fleet, {"lifecycle_state": "removed"})
    assert removed.status_code == 200, removed.text
    gone = await call(fleet, "lc_pinned", "1.0.0")
    assert gone.error is not None
    assert gone.error.code == "tool_removed"
    detail = (await api.get("/v1/tools/lc__report", headers=admin(fleet))).json()
    assert [m["version"] for m in detail["versions"]] == ["2.0.0"]

    # Audit names the operator of each change.
    async def audited() -> list[dict[str, Any]]:
        records = [
            r
            for r in await _audit_records(fleet)
            if r["event_type"] == EventType.TOOL_LIFECYCLE_CHANGED and r["tool_id"] == "lc__report"
        ]
        return records if len(records) >= 3 else []

    records = await eventually(audited, timeout=20)
    assert {r["actor"] for r in records} == {OPERATOR}
    assert {r["auth"]["authid"] for r in records} == {OPERATOR}
    changes = [r["ocsf"]["unmapped"]["lifecycle_state"] for r in records]
    assert sorted(changes) == ["deprecated", "removed", "sunset"]


async def _audit_records(fleet: Fleet) -> list[dict[str, Any]]:
    consumer = AIOKafkaConsumer(
        fleet.topic(TopicName.AUDIT),
        **connection_kwargs(fleet.settings),
        auto_offset_reset="earliest",
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    found: list[dict[str, Any]] = []
    try:
        while batch := await consumer.getmany(timeout_ms=300):
            for records in batch.values():
                found += [json.loads(r.value)["data"] for r in records if r.value]
    finally:
        await consumer.stop()
    return found
