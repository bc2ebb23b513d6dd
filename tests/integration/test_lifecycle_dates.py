"""Lifecycle dates through ``PATCH /v1/tools/{id}/versions/{v}``: a deprecation announced
ahead warns callers only from its date, and dates that contradict each other are refused
with RFC 9457 problems."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.support.api import running_app
from toolfleet.api import ApiSettings
from toolfleet.api.resources import ApiResources
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.contract.manifest import ToolManifest
from toolfleet.events.models import Effect
from toolfleet.registry.lookup import ToolLookup
from toolfleet.registry.store import RegistryStore

pytestmark = pytest.mark.integration

TOOL = "dates__report"
SUNSET_NOW = "dates__sunset_now"
SUNSET_BOTH = "dates__sunset_both"
REMOVED = "dates__removed"


@pytest.fixture(scope="module")
async def app(api_settings: ApiSettings) -> AsyncIterator[FastAPI]:
    async with running_app(api_settings) as application:
        res: ApiResources = application.state.resources
        store = RegistryStore(res.pool)
        for tool_id, version in [
            (TOOL, "1.0.0"),
            (TOOL, "1.1.0"),
            (TOOL, "2.0.0"),
            (SUNSET_NOW, "1.0.0"),
            (SUNSET_BOTH, "1.0.0"),
            (REMOVED, "1.0.0"),
        ]:
            await store.register(
                ToolManifest(
                    tool_id=tool_id,
                    version=version,
                    effect=Effect.READ_ONLY,
                    input_schema={"type": "object"},
                    output_schema={"type": "object"},
                    redaction_allowlist=[],
                    timeout_seconds=5,
                )
            )
        yield application


@pytest.fixture
def api(http: httpx.AsyncClient, issuer: TokenIssuer) -> httpx.AsyncClient:
    token = issuer.issue(tenant_id="ops", agent_did="did:operator:bob", scopes=["admin"])
    http.headers["Authorization"] = f"Bearer {token}"
    return http


def _day(days: int) -> datetime:
    return (datetime.now(UTC) + timedelta(days=days)).replace(microsecond=0)


async def _patch(api: httpx.AsyncClient, version: str, body: dict[str, Any]) -> httpx.Response:
    return await api.patch(f"/v1/tools/{TOOL}/versions/{version}", json=body)


async def _listed(api: httpx.AsyncClient, version: str) -> dict[str, Any]:
    tool = (await api.get(f"/v1/tools/{TOOL}")).json()
    found: dict[str, Any] = next(v for v in tool["versions"] if v["version"] == version)
    return found


async def test_a_deprecation_announced_ahead_warns_only_from_its_date(
    api: httpx.AsyncClient, app: FastAPI
) -> None:
    starts, ends = _day(7), _day(60)
    response = await _patch(
        api,
        "1.0.0",
        {
            "lifecycle_state": "deprecated",
            "deprecation_date": starts.isoformat(),
            "sunset_date": ends.isoformat(),
            "deprecated_in_favor_of": "2.0.0",
        },
    )
    assert response.status_code == 200, response.text
    assert response.json()["lifecycle_state"] == "active"  # as of now
    listed = (await api.get("/v1/tools")).json()["items"]
    summary = next(t for t in listed if t["tool_id"] == TOOL)
    old = next(v for v in summary["versions"] if v["version"] == "1.0.0")
    assert (old["lifecycle_state"], old["deprecated"]) == ("active", False)
    assert old["deprecation_date"].startswith(starts.date().isoformat())
    assert (await _listed(api, "1.0.0"))["deprecation_date"] is not None

    pool = app.state.resources.pool
    warning = f"tool {TOOL}@1.0.0 is deprecated; use 2.0.0; sunset on {ends.date()}"
    for at, warnings in (
        (datetime.now(UTC), []),
        (starts - timedelta(seconds=1), []),
        (starts, [warning]),
        (ends - timedelta(seconds=1), [warning]),
    ):
        lookup = ToolLookup(RegistryStore(pool), ttl_s=0, clock=lambda at=at: at)
        resolved = await lookup.resolve(TOOL, "1.0.0")
        assert resolved.warnings == warnings, at


async def test_a_sunset_before_the_deprecation_is_refused(api: httpx.AsyncClient) -> None:
    response = await _patch(
        api,
        "1.1.0",
        {
            "lifecycle_state": "deprecated",
            "deprecation_date": _day(30).isoformat(),
            "sunset_date": _day(10).isoformat(),
        },
    )
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    problem = response.json()
    assert problem["code"] == "invalid_parameters"
    assert problem["status"] == 422
    assert "sunset_date must come after deprecation_date" in problem["detail"]
    assert (await _listed(api, "1.1.0"))["lifecycle_state"] == "active"  # nothing changed


async def test_a_sunset_before_the_stored_deprecation_is_refused(api: httpx.AsyncClient) -> None:
    first = await _patch(
        api,
        "1.1.0",
        {"lifecycle_state": "deprecated", "deprecation_date": _day(20).isoformat()},
    )
    assert first.status_code == 200, first.text
    earlier = await _patch(
        api, "1.1.0", {"lifecycle_state": "deprecated", "sunset_date": _day(5).isoformat()}
    )
    assert earlier.status_code == 422
    assert earlier.headers["content-type"].startswith("application/problem+json")
    assert earlier.json()["code"] == "invalid_parameters"
    assert "deprecation_date" in earlier.json()


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"lifecycle_state": "deprecated", "deprecation_date": "2027-01-01T00:00:00"}, "timezone"),
        ({"lifecycle_state": "deprecated", "sunset_date": "2027-01-01T00:00:00"}, "timezone"),
        (
            {"lifecycle_state": "removed", "sunset_date": "2027-01-01T00:00:00Z"},
            "has no dates",
        ),
    ],
)
async def test_dates_without_a_timezone_or_on_a_removal_are_refused(
    api: httpx.AsyncClient, body: dict[str, Any], detail: str
) -> None:
    response = await _patch(api, "2.0.0", body)
    assert response.status_code == 422
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "invalid_parameters"
    assert detail in response.json()["detail"]


async def test_sunsetting_an_active_version_deprecates_and_sunsets_it_now(
    api: httpx.AsyncClient,
) -> None:
    # What `toolfleet tools sunset X@1.0.0` sends: no dates, so both default to now.
    response = await api.patch(
        f"/v1/tools/{SUNSET_NOW}/versions/1.0.0", json={"lifecycle_state": "sunset"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["previous_state"], body["lifecycle_state"]) == ("active", "sunset")
    assert body["deprecation_date"] == body["sunset_date"]
    tool = (await api.get(f"/v1/tools/{SUNSET_NOW}")).json()
    assert tool["versions"][0]["lifecycle_state"] == "sunset"


async def test_a_sunset_may_share_its_instant_with_the_deprecation_a_deprecation_may_not(
    api: httpx.AsyncClient,
) -> None:
    at = _day(3).isoformat()
    same = {"deprecation_date": at, "sunset_date": at}
    refused = await api.patch(
        f"/v1/tools/{SUNSET_BOTH}/versions/1.0.0", json={"lifecycle_state": "deprecated", **same}
    )
    assert refused.status_code == 422
    assert "sunset_date must come after deprecation_date" in refused.json()["detail"]
    accepted = await api.patch(
        f"/v1/tools/{SUNSET_BOTH}/versions/1.0.0", json={"lifecycle_state": "sunset", **same}
    )
    assert accepted.status_code == 200, accepted.text
    assert accepted.json()["sunset_date"] == accepted.json()["deprecation_date"]


async def test_a_tool_whose_only_version_is_removed_is_gone_like_in_the_lists(
    api: httpx.AsyncClient,
) -> None:
    assert (await api.get(f"/v1/tools/{REMOVED}")).status_code == 200
    removed = await api.patch(
        f"/v1/tools/{REMOVED}/versions/1.0.0", json={"lifecycle_state": "removed"}
    )
    assert removed.status_code == 200, removed.text
    listed = (await api.get("/v1/tools", params={"page_size": 200})).json()["items"]
    assert REMOVED not in {t["tool_id"] for t in listed}
    response = await api.get(f"/v1/tools/{REMOVED}")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "tool_not_found"
