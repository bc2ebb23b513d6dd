"""MCP tools as fleet tools, and their results as fleet results (pure logic).

A result is ``{"content": [block, ...], "structured_content": ...}``, one item per MCP
content block, in the server's order::

    {"type": "text", "text": ...}
    {"type": "image" | "audio", "mime_type": ..., "bytes": 1234, "data": "<base64>"}
    {"type": "resource", "uri": ..., "mime_type": ..., "text": ...}
    {"type": "resource", "uri": ..., "mime_type": ..., "bytes": 1234, "data": "<base64>"}
    {"type": "resource_link", "uri": ..., "name": ..., "mime_type": ..., "bytes": ...}

``bytes`` is the decoded size. Binary data stays in the result: a result larger than
``TOOLFLEET_RESULT_INLINE_BYTES`` reaches clients as an attachment beside a preview,
like every large result. Only ``content`` is visible unless the operator set the tool's
redaction allowlist (``sources configure NAME TOOL --allow content.text``, say, hides
binary data). ``isError`` becomes a typed ``tool_execution_error`` whose message never
carries the server's text.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    Tool,
)

from toolfleet.errors import ResultValidationFailed, ToolExecutionError
from toolfleet.sources.models import UNVOUCHED_EFFECT, SourceDefinition, SourceTool
from toolfleet.sources.naming import mcp_tool_id, schema_version
from toolfleet.sources.rules import with_rules

_STRING = {"type": "string"}
_SIZE = {"type": "integer", "minimum": 0}
_BLOCKS = {
    "type": "array",
    "items": {
        "oneOf": [
            {
                "type": "object",
                "properties": {"type": {"const": "text"}, "text": _STRING},
                "required": ["type", "text"],
            },
            {
                "type": "object",
                "properties": {
                    "type": {"enum": ["image", "audio"]},
                    "mime_type": _STRING,
                    "bytes": _SIZE,
                    "data": _STRING,
                },
                "required": ["type", "mime_type", "bytes", "data"],
            },
            {
                "type": "object",
                "properties": {
                    "type": {"const": "resource"},
                    "uri": _STRING,
                    "mime_type": _STRING,
                    "text": _STRING,
                    "bytes": _SIZE,
                    "data": _STRING,
                },
                "required": ["type", "uri"],
            },
            {
                "type": "object",
                "properties": {
                    "type": {"const": "resource_link"},
                    "uri": _STRING,
                    "name": _STRING,
                    "description": _STRING,
                    "mime_type": _STRING,
                    "bytes": _SIZE,
                },
                "required": ["type", "uri", "name"],
            },
        ]
    },
}


def output_schema_of(tool: Tool) -> dict[str, Any]:
    structured: dict[str, Any] = dict(tool.output_schema or {"type": "object"})
    return {
        "type": "object",
        "properties": {"content": _BLOCKS, "structured_content": structured},
        "required": ["content"],
    }


def source_tool(source: SourceDefinition, tool: Tool) -> SourceTool:
    """``tool`` of the MCP server ``source``, named, versioned and allowlisted."""
    input_schema = dict(tool.input_schema)
    output_schema = output_schema_of(tool)
    # The server's annotations are its own claims: kept for the operator to read, never
    # the effect (a hostile server marks its destructive tool read-only).
    hints = (
        tool.annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
        if tool.annotations
        else {}
    )
    found = SourceTool(
        tool_id=mcp_tool_id(source.name, tool.name),
        version=schema_version(input_schema, output_schema),
        source=source.name,
        source_type="mcp",
        tenant_id=source.tenant_id,
        remote_name=tool.name,
        description=tool.description or "",
        effect=UNVOUCHED_EFFECT,
        hints=hints,
        input_schema=input_schema,
        output_schema=output_schema,
        redaction_allowlist=[],
        timeout_seconds=source.timeout_s,
    )
    return with_rules(source, found)


def result_of(tool: SourceTool, answer: CallToolResult) -> dict[str, Any]:
    """The fleet result of one ``tools/call`` answer; ``isError`` raises."""
    if answer.is_error:
        raise ToolExecutionError(
            f"{tool.tool_id}: the MCP server reported a tool error",
            details={"source": tool.source, "tool": tool.remote_name},
        )
    result: dict[str, Any] = {"content": [block_of(tool, block) for block in answer.content]}
    if isinstance(answer.structured_content, dict):
        result["structured_content"] = answer.structured_content
    return result


def block_of(tool: SourceTool, block: ContentBlock) -> dict[str, Any]:
    """One MCP content block as a result item (see the module docstring)."""
    if isinstance(block, TextContent):
        return {"type": "text", "text": block.text}
    if isinstance(block, ImageContent | AudioContent):
        return {
            "type": block.type,
            "mime_type": block.mime_type,
            "bytes": _decoded_size(tool, block.data),
            "data": block.data,
        }
    if isinstance(block, EmbeddedResource):
        item: dict[str, Any] = {"type": "resource", "uri": block.resource.uri}
        if block.resource.mime_type is not None:
            item["mime_type"] = block.resource.mime_type
        if isinstance(block.resource, BlobResourceContents):
            item["bytes"] = _decoded_size(tool, block.resource.blob)
            item["data"] = block.resource.blob
        else:
            item["text"] = block.resource.text
        return item
    assert isinstance(block, ResourceLink)
    link: dict[str, Any] = {"type": "resource_link", "uri": block.uri, "name": block.name}
    optional = {"description": block.description, "mime_type": block.mime_type}
    link |= {k: v for k, v in optional.items() if v is not None}
    if block.size is not None:
        link["bytes"] = block.size
    return link


def _decoded_size(tool: SourceTool, data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=True))
    except (binascii.Error, ValueError):
        raise ResultValidationFailed(
            f"{tool.tool_id}: the MCP server sent binary content that is not base64",
            details={"source": tool.source, "tool": tool.remote_name},
        ) from None
