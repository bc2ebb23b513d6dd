"""Tool sources, pure logic: names and versions, the untrusted rule, OpenAPI import,
HTTP request building and status mapping, MCP results, the CLI's source definition."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcp.types import CallToolResult, ImageContent, TextContent, Tool
from pydantic import ValidationError

from toolfleet.auth.grants import GrantSigner, GrantVerifier
from toolfleet.cli.errors import CliError
from toolfleet.cli.invoke import document_context
from toolfleet.cli.sources import definition
from toolfleet.errors import ErrorCode, PermissionDenied, ToolExecutionError, ToolfleetError
from toolfleet.events.identity import CallRef
from toolfleet.events.models import TOOL_ID_PATTERN
from toolfleet.isolation.egress import StaticResolver
from toolfleet.policy.documents import allowed_by
from toolfleet.sources import http_tools, mcp_tools, openapi
from toolfleet.sources.models import HttpOperation, SourceDefinition, SourceKind, SourceTool
from toolfleet.sources.naming import http_tool_id, id_part, mcp_tool_id, schema_version

pytestmark = pytest.mark.unit


@given(st.text(max_size=40), st.text(max_size=40))
def test_any_server_and_tool_name_make_a_valid_tool_id(server: str, tool: str) -> None:
    assert re.fullmatch(TOOL_ID_PATTERN, mcp_tool_id(server, tool))
    assert re.fullmatch(TOOL_ID_PATTERN, http_tool_id(server, tool))


def test_names_are_lower_cased_and_joined() -> None:
    assert mcp_tool_id("GitHub", "create-issue") == "mcp__github__create_issue"
    assert id_part("a__b") == "a_b"  # "__" is the id's separator only
    assert id_part("!!") == "tool"


def test_the_version_is_the_schemas() -> None:
    one = schema_version({"type": "object"}, {"type": "object"})
    assert one == schema_version({"type": "object"}, {"type": "object"})
    assert one != schema_version({"type": "object", "required": ["a"]}, {"type": "object"})
    assert one.startswith("1.0.0+h")


def test_no_glob_allows_a_source_tool() -> None:
    tool = "mcp__github__create_issue"
    assert not allowed_by(tool, ["*", "mcp__*", "mcp__github__*", "*__create_issue"])
    assert allowed_by(tool, [tool])
    assert not allowed_by("http__pets__get", ["http__*"])
    assert allowed_by("core__echo", ["core__*"])


def test_grants_carry_the_tokens_network_permissions() -> None:
    call = CallRef(
        invocation_id="i",
        tenant_id="t",
        agent_did="did:agent:a",
        tool_id="http__pets__get",
        tool_version="1.0.0",
    )
    signer, verifier = GrantSigner(b"k" * 32), GrantVerifier([b"k" * 32])
    signed = signer.sign(
        call=call,
        parameters={},
        capability_jti="j",
        timeout_s=30,
        network_permissions=["api.example.com"],
    )
    grant = verifier.decode(signed, call=call, parameters={})
    assert grant.network_permissions == ("api.example.com",)
    bare = signer.sign(call=call, parameters={}, capability_jti="j", timeout_s=30)
    assert verifier.decode(bare, call=call, parameters={}).network_permissions == ()


def source(**operation: Any) -> tuple[SourceDefinition, HttpOperation]:
    op = HttpOperation(operation_id="op", **operation)
    return (
        SourceDefinition(
            name="api", kind=SourceKind.HTTP, target="https://api.test/v1", operations=[op]
        ),
        op,
    )


def test_a_request_puts_each_field_where_the_operation_says() -> None:
    src, op = source(
        method="POST",
        url="/pets/{pet_id}/notes",
        path=["pet_id"],
        query=["verbose"],
        body=["text"],
    )
    request = http_tools.build_request(
        src, op, {"pet_id": "a/b", "verbose": True, "text": "hi"}, {"X-Key": "k"}
    )
    assert str(request.url) == "https://api.test/v1/pets/a%2Fb/notes?verbose=true"
    assert json.loads(request.content) == {"text": "hi"}
    assert request.headers["x-key"] == "k"
    assert request.headers["accept-encoding"] == "identity"


def test_an_operation_must_place_every_template_field() -> None:
    with pytest.raises(ValidationError, match="not in `path`"):
        HttpOperation(operation_id="op", url="/pets/{pet_id}")
    with pytest.raises(ValidationError, match="one place only"):
        HttpOperation(operation_id="op", url="/x", query=["a"], body=["a"])


def status_error(status: int, headers: dict[str, str] | None = None) -> ToolfleetError:
    src, op = source(url="/x")
    tool = http_tools.source_tool(src, op)
    response = httpx.Response(status, headers=headers, content=b"secret body")
    with pytest.raises(ToolfleetError) as caught:
        http_tools.result_of(tool, response)
    return caught.value


def test_status_codes_map_to_typed_errors() -> None:
    limited = status_error(429, {"Retry-After": "12"})
    assert (limited.code, limited.retryable, limited.retry_after_s) == (
        ErrorCode.EXTERNAL_API_ERROR,
        True,
        12.0,
    )
    assert status_error(503).retryable is True
    assert status_error(500).retryable is True
    refused = status_error(404)
    assert (refused.code, refused.retryable) == (ErrorCode.EXTERNAL_API_ERROR, False)
    assert "secret body" not in json.dumps(refused.to_error_info().model_dump(mode="json"))


def test_retry_after_reads_seconds_and_dates() -> None:
    assert http_tools.retry_after("5") == 5.0
    assert http_tools.retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=lambda: 1445412470.0) == 10.0
    assert http_tools.retry_after("soon") is None


async def test_hosts_follow_the_egress_grammar() -> None:
    request = httpx.Request("GET", "https://10.1.2.3/x")
    resolver = StaticResolver(table={})
    assert str(await http_tools.check_host(request, ["10.1.2.3"], "t", resolver)) == "10.1.2.3"
    with pytest.raises(PermissionDenied):
        await http_tools.check_host(request, ["api.example.com"], "t", resolver)
    local = httpx.Request("GET", "http://127.0.0.1:8080/")
    with pytest.raises(PermissionDenied):
        await http_tools.check_host(local, ["*"], "t", resolver)


def mcp_tool() -> SourceTool:
    src = SourceDefinition(name="gh", kind=SourceKind.MCP_STDIO, target="server")
    return mcp_tools.source_tool(
        src, Tool(name="Search", input_schema={"type": "object"}, description="d")
    )


def test_mcp_results_keep_text_and_structured_content() -> None:
    tool = mcp_tool()
    assert tool.tool_id == "mcp__gh__search"
    assert tool.redaction_allowlist == ["content"]
    answer = CallToolResult(
        content=[
            TextContent(type="text", text="found"),
            ImageContent(type="image", data="aGk=", mime_type="image/png"),
        ],
        structured_content={"n": 1},
    )
    assert mcp_tools.result_of(tool, answer) == {
        "content": [
            {"type": "text", "text": "found"},
            {"type": "image", "mime_type": "image/png", "bytes": 2, "data": "aGk="},
        ],
        "structured_content": {"n": 1},
    }


def test_an_mcp_tool_error_never_quotes_the_server() -> None:
    answer = CallToolResult(content=[TextContent(type="text", text="token=abc")], is_error=True)
    with pytest.raises(ToolExecutionError) as caught:
        mcp_tools.result_of(mcp_tool(), answer)
    assert "abc" not in str(caught.value.to_error_info().model_dump(mode="json"))


SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "servers": [{"url": "https://pets.test"}],
    "paths": {
        "/pets/{id}": {
            "parameters": [{"$ref": "#/components/parameters/Id"}],
            "get": {
                "operationId": "getPet",
                "responses": {
                    "200": {
                        "content": {"application/json": {"schema": {"type": "array", "items": {}}}}
                    }
                },
            },
            "delete": {"responses": {"204": {}}},  # no operationId: not imported
        }
    },
    "components": {"parameters": {"Id": {"name": "id", "in": "path", "schema": {}}}},
}


def test_openapi_operations_are_imported() -> None:
    doc = openapi.parse(json.dumps(SPEC))
    assert openapi.base_url(doc) == "https://pets.test"
    [op] = openapi.operations(doc)
    assert (op.operation_id, op.method, op.path) == ("getpet", "GET", ["id"])
    assert op.input_schema["required"] == ["id"]
    assert op.output_schema["properties"]["value"]["type"] == "array"


def test_openapi_refuses_what_it_cannot_read() -> None:
    with pytest.raises(openapi.OpenApiError):
        openapi.parse("swagger: '2.0'")
    bad = {**SPEC, "components": {}}
    with pytest.raises(openapi.OpenApiError, match="unresolved"):
        openapi.operations(openapi.parse(json.dumps(bad)))


def test_the_cli_builds_and_checks_the_source(tmp_path: Path) -> None:
    stdio = definition(
        "gh",
        stdio="npx server",
        http=None,
        openapi_file=None,
        redact=["search=content,structured_content.items"],
    )
    assert stdio.kind is SourceKind.MCP_STDIO
    assert stdio.redaction == {"search": ["content", "structured_content.items"]}
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    http = definition(
        "pets", stdio=None, http=None, openapi_file=spec, headers=["X-Key=key"], connection="c"
    )
    assert (http.kind, http.target, http.credential_headers) == (
        SourceKind.HTTP,
        "https://pets.test",
        {"X-Key": "key"},
    )
    with pytest.raises(CliError, match="exactly one"):
        definition("x", stdio="a", http="http://b", openapi_file=None)
    with pytest.raises(CliError, match="not a valid source"):
        definition("Bad Name", stdio="a", http=None, openapi_file=None)
    with pytest.raises(CliError, match="need the connection_id"):
        definition("gh", stdio="a", http=None, openapi_file=None, env=["TOKEN=token"])
    with pytest.raises(CliError, match="credential_headers is for"):
        definition("gh", stdio="a", http=None, openapi_file=None, headers=["A=b"], connection="c")
    sandboxed = definition(
        "fs", stdio="srv", http=None, openapi_file=None, paths=["rw:/srv/x"], hosts=["a.test"]
    )
    assert (sandboxed.filesystem_permissions, sandboxed.network_permissions) == (
        ["rw:/srv/x"],
        ["a.test"],
    )
    with pytest.raises(CliError, match="permissions are for mcp_stdio"):
        definition("pets", stdio=None, http=None, openapi_file=spec, paths=["/srv"])


def test_invoke_names_documents_with_optional_versions() -> None:
    context = document_context(["handbook", "policy@3"], "docs")
    assert context is not None
    assert [(d.document_id, d.version) for d in context.documents] == [
        ("handbook", None),
        ("policy", "3"),
    ]
    assert context.source == "docs"
    assert document_context([], None) is None
    with pytest.raises(CliError, match="ID@VERSION"):
        document_context(["handbook@"], None)
    with pytest.raises(CliError, match="more than once"):
        document_context(["a", "a@2"], None)
