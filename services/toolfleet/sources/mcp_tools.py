"""MCP tools as fleet tools, and their results as fleet results (pure logic).

A result is ``{"content": [{"type": "text", "text": ...}], "structured_content": ...}``:
only text blocks are kept, and only ``content`` is visible unless the operator set the
tool's redaction allowlist (``--redact TOOL=field,...``). ``isError`` becomes a typed
``tool_execution_error`` whose message never carries the server's text.
"""

from __future__ import annotations

from typing import Any

from mcp.types import CallToolResult, TextContent, Tool

from toolfleet.errors import ToolExecutionError
from toolfleet.sources.models import SourceDefinition, SourceTool
from toolfleet.sources.naming import mcp_tool_id, schema_version

#: What clients see of an MCP tool whose allowlist the operator did not set.
DEFAULT_ALLOWLIST = ("content",)

_TEXT_BLOCKS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
        "required": ["type", "text"],
    },
}


def output_schema_of(tool: Tool) -> dict[str, Any]:
    structured: dict[str, Any] = dict(tool.output_schema or {"type": "object"})
    return {
        "type": "object",
        "properties": {"content": _TEXT_BLOCKS, "structured_content": structured},
        "required": ["content"],
    }


def source_tool(source: SourceDefinition, tool: Tool) -> SourceTool:
    """``tool`` of the MCP server ``source``, named, versioned and allowlisted."""
    input_schema = dict(tool.input_schema)
    output_schema = output_schema_of(tool)
    read_only = bool(tool.annotations and tool.annotations.read_only_hint)
    return SourceTool(
        tool_id=mcp_tool_id(source.name, tool.name),
        version=schema_version(input_schema, output_schema),
        source=source.name,
        tenant_id=source.tenant_id,
        remote_name=tool.name,
        description=tool.description or "",
        effect="read_only" if read_only else "external_side_effect",
        input_schema=input_schema,
        output_schema=output_schema,
        redaction_allowlist=list(source.redaction.get(tool.name, DEFAULT_ALLOWLIST)),
        timeout_seconds=source.timeout_s,
    )


def result_of(tool: SourceTool, answer: CallToolResult) -> dict[str, Any]:
    """The fleet result of one ``tools/call`` answer; ``isError`` raises."""
    if answer.is_error:
        raise ToolExecutionError(
            f"{tool.tool_id}: the MCP server reported a tool error",
            details={"source": tool.source, "tool": tool.remote_name},
        )
    text = [
        {"type": "text", "text": block.text}
        for block in answer.content
        if isinstance(block, TextContent)
    ]
    result: dict[str, Any] = {"content": text}
    if isinstance(answer.structured_content, dict):
        result["structured_content"] = answer.structured_content
    return result
