"""``/v1/sources`` against real Postgres and a real stdio MCP server (admin scope): add,
list, remove, a tool's result rules; the policy warning about source-tool globs; tool
ids another source or a native tool holds are refused."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import httpx
import pytest

from tests.integration.test_api_policies import Auth, api_settings, app, auth
from toolfleet.events.models import Effect
from toolfleet.registry.manifest import ToolManifest
from toolfleet.registry.store import RegistryStore
from toolfleet.storage.postgres import create_pool

pytestmark = pytest.mark.integration

__all__ = ["api_settings", "app", "auth"]  # fixtures shared with policies


async def test_an_admin_adds_lists_and_removes_a_source(
    http: httpx.AsyncClient, auth: Auth, tmp_path: Path
) -> None:
    name = f"s{uuid.uuid4().hex[:8]}"
    body = {
        "name": name,
        "kind": "mcp_stdio",
        "target": f"{sys.executable} -m tests.support.source_servers {tmp_path}",
    }
    refused = await http.post("/v1/sources", json=body, headers=auth("t1"))
    assert refused.status_code == 403

    added = await http.post("/v1/sources", json=body, headers=auth("t1", admin=True))
    assert added.status_code == 201, added.text
    tools = {t["tool_id"]: t for t in added.json()["tools"]}
    assert f"mcp__{name}__add" in tools
    assert tools[f"mcp__{name}__add"]["redaction_allowlist"] == ["content"]

    listed = await http.get("/v1/sources", headers=auth("t1", admin=True))
    assert name in [s["name"] for s in listed.json()["sources"]]
    # Registered, so a policy may name it; a glob never allows it.
    policy = {"allow_tools": ["core__*", f"mcp__{name}__add"]}
    put = await http.put("/v1/policies/t_src", json=policy, headers=auth("t1", admin=True))
    assert put.status_code == 200, put.text

    removed = await http.delete(f"/v1/sources/{name}", headers=auth("t1", admin=True))
    assert removed.json() == {"removed": name}
    gone = await http.get(f"/v1/sources/{name}", headers=auth("t1", admin=True))
    assert gone.status_code == 404


async def test_a_source_that_cannot_be_listed_now_is_stored_for_the_executors(
    http: httpx.AsyncClient, auth: Auth
) -> None:
    body = {"name": "broken", "kind": "mcp_http", "target": "http://127.0.0.1:9/mcp"}
    answer = await http.post("/v1/sources", json=body, headers=auth("t1", admin=True))
    assert answer.status_code == 202
    assert answer.json()["tools"] == []
    assert "could not be listed" in answer.json()["warnings"][0]
    stored = await http.get("/v1/sources/broken", headers=auth("t1", admin=True))
    assert stored.status_code == 200


async def test_an_admin_sets_a_tools_result_rules_and_globs_are_warned_about(
    http: httpx.AsyncClient, auth: Auth, tmp_path: Path, module_database_url: str
) -> None:
    name = f"s{uuid.uuid4().hex[:8]}"
    body = {
        "name": name,
        "kind": "mcp_stdio",
        "target": f"{sys.executable} -m tests.support.source_servers {tmp_path}",
    }
    admin = auth("t1", admin=True)
    assert (await http.post("/v1/sources", json=body, headers=admin)).status_code == 201
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
    assert added.status_code == 201, added.text
    assert [t["tool_id"] for t in added.json()["tools"]] == [tool_id]
    # The same source again (a replacement) keeps its own id.
    again = await http.post("/v1/sources", json=http_body(first, tool_id), headers=admin)
    assert again.status_code == 201, again.text

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
