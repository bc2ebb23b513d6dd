"""HTTP tools keep their manifest id, and what makes a tool untrusted is where it comes
from (its ``source_type``), not its name (pure logic)."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from toolfleet.contract.manifest import SourceType
from toolfleet.errors import PermissionDenied
from toolfleet.events.models import Effect
from toolfleet.policy.catalog import CatalogView
from toolfleet.policy.documents import PolicyDocument, TenantPolicy, allowed_by
from toolfleet.policy.engine import PolicyQuery, allows_tool, decide_tenant
from toolfleet.sources import http_tools, openapi
from toolfleet.sources.models import HttpOperation, SourceDefinition, SourceKind, SourceTool
from toolfleet.sources.naming import glob_warnings, is_untrusted, pattern_allows
from toolfleet.sources.store import manifest_of

pytestmark = pytest.mark.unit


def http_source(*operations: HttpOperation) -> SourceDefinition:
    return SourceDefinition(
        name="pets", kind=SourceKind.HTTP, target="https://pets.test", operations=list(operations)
    )


def query(tool_id: str, *, source_tool: bool) -> PolicyQuery:
    return PolicyQuery(
        tenant_id="t1",
        agent_did="did:agent:x",
        tool_id=tool_id,
        version="1.0.0",
        effect=Effect.READ_ONLY,
        approval_requested=False,
        source_tool=source_tool,
    )


def test_a_declared_operation_keeps_its_tool_id() -> None:
    op = HttpOperation(operation_id="get_pet", url="/pets", tool_id="acme__get_pet")
    tool = http_tools.source_tool(http_source(op), op)
    assert (tool.tool_id, tool.source_type, tool.remote_name) == (
        "acme__get_pet",
        "http",
        "get_pet",
    )
    assert manifest_of(tool).source_type is SourceType.HTTP


def test_an_undeclared_operation_is_named_after_its_source() -> None:
    op = HttpOperation(operation_id="get_pet", url="/pets")
    assert http_tools.source_tool(http_source(op), op).tool_id == "http__pets__get_pet"


@pytest.mark.parametrize("bad", ["acme", "Acme__get", "acme__", "mcp__acme__get"])
def test_a_declared_tool_id_follows_the_registrys_pattern(bad: str) -> None:
    with pytest.raises(ValidationError):
        HttpOperation(operation_id="get_pet", url="/pets", tool_id=bad)


def test_tool_ids_are_unique_within_a_source() -> None:
    with pytest.raises(ValidationError, match="tool ids repeat"):
        http_source(
            HttpOperation(operation_id="a", url="/a", tool_id="acme__pet"),
            HttpOperation(operation_id="b", url="/b", tool_id="acme__pet"),
        )


def test_openapi_takes_the_tool_id_from_its_extension() -> None:
    spec = {
        "openapi": "3.0.3",
        "paths": {
            "/pets": {
                "get": {"operationId": "listPets", "x-toolfleet-tool-id": "acme__list_pets"},
                "post": {"operationId": "createPet"},
            }
        },
    }
    ops = openapi.operations(openapi.parse(json.dumps(spec)))
    assert [(o.operation_id, o.tool_id) for o in ops] == [
        ("listpets", "acme__list_pets"),
        ("createpet", None),
    ]


def test_rows_stored_before_source_type_existed_get_it_from_their_prefix() -> None:
    row = {
        "tool_id": "http__pets__get",
        "version": "1.0.0",
        "source": "pets",
        "remote_name": "get",
        "effect": "read_only",
        "input_schema": {},
        "output_schema": {},
        "redaction_allowlist": [],
        "timeout_seconds": 30.0,
    }
    assert SourceTool.model_validate(row).source_type == "http"
    mcp_row = {**row, "tool_id": "mcp__gh__issue"}
    assert SourceTool.model_validate(mcp_row).source_type == "mcp"


def test_untrusted_by_source_type_and_by_the_mcp_prefix() -> None:
    assert is_untrusted("acme__get_pet", source_tool=True)
    assert not is_untrusted("acme__get_pet")
    assert is_untrusted("mcp__gh__issue")  # defence in depth: the prefix alone is enough
    assert not pattern_allows("acme__get_pet", "acme__*", glob_matches=True, source_tool=True)
    assert pattern_allows("acme__get_pet", "acme__get_pet", glob_matches=True, source_tool=True)
    assert pattern_allows("acme__search", "acme__*", glob_matches=True)


def test_a_source_tool_needs_its_exact_id_whatever_its_name() -> None:
    assert not allowed_by("acme__get_pet", ["acme__*", "*"], source_tool=True)
    assert allowed_by("acme__get_pet", ["acme__get_pet"], source_tool=True)
    assert allowed_by("acme__search", ["acme__*"])
    assert not allowed_by("mcp__gh__issue", ["mcp__*"], source_tool=False)


def test_policy_denies_a_source_tool_under_a_glob_and_allows_it_named() -> None:
    globbed = TenantPolicy(allow_tools=["acme__*"])
    with pytest.raises(PermissionDenied):
        decide_tenant(globbed, query("acme__get_pet", source_tool=True))
    assert decide_tenant(globbed, query("acme__search", source_tool=False)).reason
    named = TenantPolicy(allow_tools=["acme__*", "acme__get_pet"])
    assert not decide_tenant(named, query("acme__get_pet", source_tool=True)).needs_approval
    # An agent's narrowing is an allow list too.
    narrowed = TenantPolicy(
        allow_tools=["acme__get_pet"], agents={"did:agent:x": {"allow_tools": ["acme__*"]}}
    )
    with pytest.raises(PermissionDenied):
        decide_tenant(narrowed, query("acme__get_pet", source_tool=True))


def test_the_development_policy_never_allows_a_source_tool() -> None:
    dev = PolicyDocument.model_validate({"tenants": {"*": {"allow_tools": ["core__*"]}}})
    with pytest.raises(PermissionDenied):
        decide_tenant(dev.for_tenant("t1"), query("core__fetch", source_tool=True))
    assert not allows_tool(dev.for_tenant("t1"), "core__fetch", source_tool=True)
    assert allows_tool(dev.for_tenant("t1"), "core__echo")


def test_the_catalog_shows_a_source_tool_only_when_named() -> None:
    policy = TenantPolicy(allow_tools=["acme__*"])
    view = CatalogView(policy=policy, source_tools=frozenset({"acme__get_pet"}))
    assert not view.shows("acme__get_pet")
    assert view.shows("acme__search")
    named = CatalogView(
        policy=TenantPolicy(allow_tools=["acme__get_pet"]),
        source_tools=frozenset({"acme__get_pet"}),
    )
    assert named.shows("acme__get_pet")


def test_globs_over_source_tools_are_warned_about_whatever_their_name() -> None:
    known = {"acme__get_pet", "acme__search"}
    [warning] = glob_warnings([("allow_tools.0", "acme__*")], known, source_tools={"acme__get_pet"})
    assert warning.startswith("allow_tools.0 'acme__*' allows no MCP or HTTP source tool")
    assert "acme__get_pet" in warning
    assert "acme__search" not in warning
    assert glob_warnings([("allow_tools.0", "acme__*")], known) == []
