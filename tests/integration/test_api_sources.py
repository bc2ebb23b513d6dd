"""``/v1/sources`` against real Postgres and a real stdio MCP server (admin scope): add
(the API stores the source and requests a listing; an executor's listing job, run here
in process, lists the tools), list, refresh, remove, a tool's result rules; the policy
warning about source-tool globs; tool ids another source or a native tool holds are
refused; another tenant neither reads nor requests a listing."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_api_policies import Auth, api_settings, app, auth
from tests.support.eventually import eventually
from tests.support.listing import listing_executor
from toolfleet.api import ApiSettings
from toolfleet.contract.manifest import ToolManifest
from toolfleet.events.models import Effect
from toolfleet.registry.store import RegistryStore
from toolfleet.storage.postgres import create_pool

pytestmark = pytest.mark.integration

__all__ = ["api_settings", "app", "auth"]  # fixtures shared with policies


@pytest.fixture
async def executor(api_settings: ApiSettings) -> AsyncIterator[asyncio.Task[None]]:
    """What an executor does for the API: list the sources it asks for."""
    async with listing_executor(api_settings.database_url) as job:
        yield job


async def listed(http: httpx.AsyncClient, name: str, headers: dict[str, str]) -> dict[str, Any]:
    """The source's listing once an executor answered it."""

    async def done() -> dict[str, Any] | None:
        listing: dict[str, Any] = (
            await http.get(f"/v1/sources/{name}/listing", headers=headers)
        ).json()
        return None if listing["state"] == "pending" else listing

    return await eventually(done, timeout=60)


def stdio_body(name: str, state: Path) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "mcp_stdio",
        "target": f"{sys.executable} -m tests.support.source_servers {state}",
    }


async def test_an_admin_adds_a_source_an_executor_lists_it_and_it_is_removed(
    http: httpx.AsyncClient, auth: Auth, tmp_path: Path, executor: asyncio.Task[None]
) -> None:
    name = f"s{uuid.uuid4().hex[:8]}"
    body = stdio_body(name, tmp_path)
    admin = auth("t1", admin=True)
    refused = await http.post("/v1/sources", json=body, headers=auth("t1"))
    assert refused.status_code == 403

    added = await http.post("/v1/sources", json=body, headers=admin)
    assert added.status_code == 202, added.text  # stored; the API started nothing
    assert added.headers["location"] == f"/v1/sources/{name}/listing"
    assert added.json()["listing"]["state"] == "pending"

    listing = await listed(http, name, admin)
    assert listing["state"] == "ready", listing
    assert listing["listed_by"] == "test-executor"
    view = (await http.get(f"/v1/sources/{name}", headers=admin)).json()
    tools = {t["tool_id"]: t for t in view["tools"]}
    assert listing["tools"] == len(tools)
    assert tools[f"mcp__{name}__add"]["redaction_allowlist"] == ["content"]
    assert tools[f"mcp__{name}__add"]["effect"] == "external_side_effect"

    listed_all = await http.get("/v1/sources", headers=admin)
    assert name in [s["name"] for s in listed_all.json()["sources"]]
    assert listed_all.json()["listings"][name] == "ready"
    # Registered, so a policy may name it; a glob never allows it.
    policy = {"allow_tools": ["core__*", f"mcp__{name}__add"]}
    put = await http.put("/v1/policies/t_src", json=policy, headers=auth("t1", admin=True))
    assert put.status_code == 200, put.text

    removed = await http.delete(f"/v1/sources/{name}", headers=admin)
    assert removed.json() == {"removed": name}
    gone = await http.get(f"/v1/sources/{name}", headers=admin)
    assert gone.status_code == 404
    assert (await http.get(f"/v1/sources/{name}/listing", headers=admin)).status_code == 404


async def test_with_no_executor_a_listing_stays_pending(
    http: httpx.AsyncClient, auth: Auth, tmp_path: Path
) -> None:
    name, admin = f"p{uuid.uuid4().hex[:8]}", auth("t1", admin=True)
    added = await http.post("/v1/sources", json=stdio_body(name, tmp_path), headers=admin)
    assert added.status_code == 202
    assert added.json()["tools"] == []
    listing = (await http.get(f"/v1/sources/{name}/listing", headers=admin)).json()
    assert (listing["state"], listing["attempts"], listing["listed_at"]) == ("pending", 0, None)
    assert not (tmp_path / "starts").exists()  # nothing started the server
    early = await http.put(
        f"/v1/sources/{name}/tools/add/effect", json={"effect": "read_only"}, headers=admin
    )
    assert early.status_code == 404
    assert "none of its tools is listed yet" in early.json()["detail"]


async def test_an_unreachable_source_fails_retryably_and_a_refresh_asks_again(
    http: httpx.AsyncClient, auth: Auth, executor: asyncio.Task[None]
) -> None:
    name, admin = f"b{uuid.uuid4().hex[:8]}", auth("t1", admin=True)
    body = {"name": name, "kind": "mcp_http", "target": "http://127.0.0.1:9/mcp"}
    assert (await http.post("/v1/sources", json=body, headers=admin)).status_code == 202
    failed = await listed(http, name, admin)
    assert failed["state"] == "failed"
    assert (failed["error"]["code"], failed["error"]["retryable"]) == ("external_api_error", True)
    assert failed["next_attempt_at"] is not None  # executors try again later by themselves
    assert (await http.get(f"/v1/sources/{name}", headers=admin)).status_code == 200

    again = await http.post(f"/v1/sources/{name}/listing", headers=admin)
    assert again.status_code == 202
    assert (again.json()["state"], again.json()["request"], again.json()["error"]) == (
        "pending",
        2,
        None,
    )


async def test_another_tenant_neither_reads_nor_requests_a_listing(
    http: httpx.AsyncClient, auth: Auth, tmp_path: Path
) -> None:
    name, admin = f"t{uuid.uuid4().hex[:8]}", auth("ops", admin=True)
    body = {**stdio_body(name, tmp_path), "tenant_id": "tenant_a"}
    assert (await http.post("/v1/sources", json=body, headers=admin)).status_code == 202
    path = f"/v1/sources/{name}/listing"
    for tenant in ("tenant_b", "tenant_a"):  # another tenant, and the source's own: admin only
        asked = await http.post(path, headers=auth(tenant))
        assert asked.status_code == 403
        assert (await http.get(path, headers=auth(tenant))).status_code == 403
        assert (await http.get(f"/v1/sources/{name}", headers=auth(tenant))).status_code == 403
    listing = (await http.get(path, headers=admin)).json()
    assert (listing["request"], listing["tenant_id"], listing["state"]) == (
        1,
        "tenant_a",
        "pending",
    )
    assert not (tmp_path / "starts").exists()


async def test_an_admin_sets_a_tools_result_rules_and_globs_are_warned_about(
    http: httpx.AsyncClient,
    auth: Auth,
    tmp_path: Path,
    module_database_url: str,
    executor: asyncio.Task[None],
) -> None:
    name = f"s{uuid.uuid4().hex[:8]}"
    admin = auth("t1", admin=True)
    added = await http.post("/v1/sources", json=stdio_body(name, tmp_path), headers=admin)
    assert added.status_code == 202
    assert (await listed(http, name, admin))["state"] == "ready"
    rules = {
        "allow": ["content.text"],
        "result_validation": "coerce",
        "sanitize": {"$.content[*].text": "redact"},
        "max_result_bytes": 2048,
    }
    path = f"/v1/sources/{name}/tools/add/rules"
    assert (await http.put(path, json=rules, headers=auth("t1"))).status_code == 403
    answer = await http.put(path, json=rules, headers=admin)
    assert answer.status_code == 200, answer.text
    assert answer.json()["source"]["redaction"] == {"add": ["content.text"]}
    [add] = [t for t in answer.json()["tools"] if t["remote_name"] == "add"]
    assert add["redaction_allowlist"] == ["content.text"]
    assert add["result_rules"]["mode"] == "coerce"
    # The registry's manifest (what validators read) follows.
    pool = await create_pool(module_database_url)
    try:
        [manifest] = await RegistryStore(pool).versions(f"mcp__{name}__add")
    finally:
        await pool.close()
    assert manifest.redaction_allowlist == ["content.text"]
    assert manifest.result_rules.max_bytes == 2048
    # The fleet's tool id names the tool too; empty rules are the defaults again.
    again = await http.put(
        f"/v1/sources/{name}/tools/mcp__{name}__add/rules", json={}, headers=admin
    )
    assert again.json()["source"]["redaction"] == {}

    bad = await http.put(path, json={"sanitize": {"*": "shred"}}, headers=admin)
    assert bad.status_code == 422
    missing = await http.put(f"/v1/sources/{name}/tools/nope/rules", json={}, headers=admin)
    assert missing.status_code == 404

    policy = {"allow_tools": ["core__*", f"mcp__{name}__*", f"mcp__{name}__add"]}
    put = await http.put("/v1/policies/t_src2", json=policy, headers=admin)
    assert put.status_code == 200, put.text
    [warning] = put.json()["warnings"]
    assert warning.startswith(f"allow_tools.1 'mcp__{name}__*' allows no MCP or HTTP source")
    assert f"mcp__{name}__add" in warning


def http_body(name: str, tool_id: str) -> dict[str, object]:
    return {
        "name": name,
        "kind": "http",
        "target": "http://127.0.0.1:9",
        "operations": [{"operation_id": "get_pet", "url": "/pets", "tool_id": tool_id}],
    }


async def test_a_declared_tool_id_another_source_or_a_native_tool_holds_is_refused(
    http: httpx.AsyncClient, auth: Auth, module_database_url: str
) -> None:
    admin = auth("t1", admin=True)
    tool_id = f"acme{uuid.uuid4().hex[:6]}__get_pet"
    first, second = f"a{uuid.uuid4().hex[:8]}", f"b{uuid.uuid4().hex[:8]}"
    added = await http.post("/v1/sources", json=http_body(first, tool_id), headers=admin)
    assert added.status_code == 201, added.text  # declared: listed at once, nothing reached
    assert [t["tool_id"] for t in added.json()["tools"]] == [tool_id]
    listing = added.json()["listing"]
    assert (listing["state"], listing["listed_by"], listing["tools"]) == ("ready", "api", 1)
    # The same source again (a replacement) keeps its own id.
    again = await http.post("/v1/sources", json=http_body(first, tool_id), headers=admin)
    assert again.status_code == 201, again.text
    refreshed = await http.post(f"/v1/sources/{first}/listing", headers=admin)
    assert refreshed.status_code == 200
    assert (refreshed.json()["state"], refreshed.json()["request"]) == ("ready", 3)

    clash = await http.post("/v1/sources", json=http_body(second, tool_id), headers=admin)
    assert clash.status_code == 409
    assert f"{tool_id} (source:{first})" in clash.json()["detail"]
    assert clash.json()["conflicting_tools"] == {tool_id: f"source:{first}"}
    gone = await http.get(f"/v1/sources/{second}", headers=admin)
    assert gone.status_code == 404  # nothing stored

    native = ToolManifest(
        tool_id=f"acme{uuid.uuid4().hex[:6]}__native",
        version="1.0.0",
        effect=Effect.READ_ONLY,
        input_schema={"type": "object"},
        output_schema={"type": "object"},
        redaction_allowlist=[],
        timeout_seconds=10,
    )
    pool = await create_pool(module_database_url)
    try:
        await RegistryStore(pool).register(native)
    finally:
        await pool.close()
    body = http_body(second, native.tool_id)
    refused = await http.post("/v1/sources", json=body, headers=admin)
    assert refused.status_code == 409
    assert f"{native.tool_id} (native)" in refused.json()["detail"]
