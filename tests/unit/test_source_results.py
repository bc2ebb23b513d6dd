"""Source results and rules: every MCP content block kept, checked and redacted like any
result; policy globs that seem to allow source tools are warned about."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
    Tool,
)

from toolfleet.errors import ResultValidationFailed
from toolfleet.registry.enforcement import visible_result
from toolfleet.registry.redaction import REDACTED
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.sources import mcp_tools
from toolfleet.sources.models import SourceDefinition, SourceKind, SourceTool
from toolfleet.sources.naming import glob_warnings
from toolfleet.sources.store import manifest_of

pytestmark = pytest.mark.unit

PNG = base64.b64encode(b"\x89PNG" + bytes(96)).decode()


def tool(**redaction: list[str]) -> SourceTool:
    source = SourceDefinition(
        name="media", kind=SourceKind.MCP_STDIO, target="server", redaction=redaction
    )
    return mcp_tools.source_tool(source, Tool(name="snap", input_schema={"type": "object"}))


ANSWER = CallToolResult(
    content=[
        TextContent(type="text", text="here"),
        ImageContent(type="image", data=PNG, mime_type="image/png"),
        AudioContent(type="audio", data="AAEC", mime_type="audio/wav"),
        EmbeddedResource(
            type="resource",
            resource=TextResourceContents(uri="file:///a.txt", mime_type="text/plain", text="A"),
        ),
        EmbeddedResource(
            type="resource",
            resource=BlobResourceContents(uri="file:///b.bin", blob="AAE="),
        ),
        ResourceLink(
            type="resource_link", uri="https://x.test/c", name="c", mime_type="text/csv", size=9
        ),
    ]
)


def test_every_content_block_is_kept_in_order_with_its_type_and_size() -> None:
    result = mcp_tools.result_of(tool(), ANSWER)
    assert result["content"] == [
        {"type": "text", "text": "here"},
        {"type": "image", "mime_type": "image/png", "bytes": 100, "data": PNG},
        {"type": "audio", "mime_type": "audio/wav", "bytes": 3, "data": "AAEC"},
        {"type": "resource", "uri": "file:///a.txt", "mime_type": "text/plain", "text": "A"},
        {"type": "resource", "uri": "file:///b.bin", "bytes": 2, "data": "AAE="},
        {
            "type": "resource_link",
            "uri": "https://x.test/c",
            "name": "c",
            "mime_type": "text/csv",
            "bytes": 9,
        },
    ]


def visible(t: SourceTool, result: dict[str, Any]) -> dict[str, Any]:
    return visible_result(CompiledSchemas(), manifest_of(t), result)


def test_the_blocks_match_the_tools_output_schema_and_pass_the_default_allowlist() -> None:
    t = tool()
    result = mcp_tools.result_of(t, ANSWER)
    assert visible(t, result) == result  # default allowlist: `content`, every block


def test_an_allowlist_of_text_fields_hides_binary_data() -> None:
    t = tool(snap=["content.type", "content.text", "content.mime_type", "content.bytes"])
    seen = visible(t, mcp_tools.result_of(t, ANSWER))
    image = seen["content"][1]
    assert image == {"type": "image", "mime_type": "image/png", "bytes": 100, "data": REDACTED}
    assert seen["content"][0] == {"type": "text", "text": "here"}


def test_binary_content_that_is_not_base64_is_a_malformed_result() -> None:
    bad = CallToolResult(content=[ImageContent(type="image", data="not base64!", mime_type="x")])
    with pytest.raises(ResultValidationFailed):
        mcp_tools.result_of(tool(), bad)


def test_allow_globs_that_seem_to_allow_source_tools_are_warned_about() -> None:
    known = {"core__echo", "mcp__gh__search", "mcp__gh__issue", "http__pets__get"}
    allows = [
        ("allow_tools.0", "core__*"),
        ("allow_tools.1", "mcp__gh__search"),
        ("allow_tools.2", "*"),
        ("agents.did:agent:x.allow_tools.0", "mcp__new__*"),
    ]
    warnings = glob_warnings(allows, known)
    assert len(warnings) == 2
    assert warnings[0].startswith("allow_tools.2 '*' allows no MCP or HTTP source tool")
    assert "http__pets__get, mcp__gh__issue, mcp__gh__search" in warnings[0]
    assert warnings[1].startswith("agents.did:agent:x.allow_tools.0 'mcp__new__*'")
