"""``GET /v1/analytics/...``: the API serves the snapshots the analytics app writes,
tenant scoped (an admin sees all), without running faust itself."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
import pytest

from tests.support.analytics import write_snapshots as snapshots_written
from tests.support.api import ApiKeys, api_settings_for
from toolfleet.api import ApiSettings
from toolfleet.auth.grants import ensure_grant_key
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.settings import FleetSettings

pytestmark = pytest.mark.integration

NOW = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def api_settings(settings: FleetSettings, api_keys: ApiKeys) -> ApiSettings:
    grant_key = api_keys.private_file.parent / "grant.key"
    ensure_grant_key(grant_key)
    return api_settings_for(settings, api_keys, grant_key_file=grant_key)


@pytest.fixture
def auth(issuer: TokenIssuer) -> Callable[..., dict[str, str]]:
    def headers(tenant: str, *, admin: bool = False) -> dict[str, str]:
        token = issuer.issue(
            tenant_id=tenant, agent_did="did:agent:ops", scopes=["admin"] if admin else None
        )
        return {"Authorization": f"Bearer {token}"}

    return headers


async def write_snapshots(settings: FleetSettings, *tenants: str) -> None:
    """What the analytics app writes after counting one call per tenant."""
    await snapshots_written(settings, dict.fromkeys(tenants, 1), now=NOW)


async def test_a_tenant_reads_its_own_analytics_and_no_one_elses(
    settings: FleetSettings, http: httpx.AsyncClient, auth: Callable[..., dict[str, str]]
) -> None:
    mine, theirs = f"tenant_{uuid.uuid4().hex[:8]}", f"tenant_{uuid.uuid4().hex[:8]}"
    await write_snapshots(settings, mine, theirs)

    answer = await http.get(f"/v1/analytics/tenants/{mine}", headers=auth(mine))
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["tenant_id"] == mine
    assert body["minutes"][0]["window"] == "1m"
    assert body["minutes"][0]["totals"]["calls"] == 1
    assert body["minutes"][0]["tools"]["core__echo"]["calls"] == 1
    assert body["hour"]["window"] == "1h"

    other = await http.get(f"/v1/analytics/tenants/{theirs}", headers=auth(mine))
    assert other.status_code == 404
    listed = await http.get("/v1/analytics/tenants", headers=auth(mine))
    assert listed.json()["tenants"] == [mine]


async def test_an_admin_sees_every_tenant_and_unseen_tenants_are_empty(
    settings: FleetSettings, http: httpx.AsyncClient, auth: Callable[..., dict[str, str]]
) -> None:
    seen = f"tenant_{uuid.uuid4().hex[:8]}"
    await write_snapshots(settings, seen)
    admin = auth("tenant_ops", admin=True)
    answer = await http.get(f"/v1/analytics/tenants/{seen}", headers=admin)
    assert answer.json()["minutes"][0]["totals"]["calls"] == 1
    assert seen in (await http.get("/v1/analytics/tenants", headers=admin)).json()["tenants"]
    unseen = await http.get("/v1/analytics/tenants/tenant_quiet", headers=admin)
    assert unseen.status_code == 200
    assert unseen.json() == {
        "tenant_id": "tenant_quiet",
        "generated_at": None,
        "minutes": [],
        "hour": None,
        "anomalies": [],
    }
    assert (await http.get(f"/v1/analytics/tenants/{seen}")).status_code == 401
