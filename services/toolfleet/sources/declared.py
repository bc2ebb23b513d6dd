"""An HTTP source's tools, as its definition declares them (pure logic: nothing is
started or reached).

The API registers them itself at ``sources add``: its operations are all there is to
list. MCP servers are asked by executors (:mod:`toolfleet.sources.listing`).
"""

from __future__ import annotations

from toolfleet.sources.models import (
    UNVOUCHED_EFFECT,
    HttpOperation,
    SourceDefinition,
    SourceKind,
    SourceTool,
)
from toolfleet.sources.naming import http_tool_id, schema_version
from toolfleet.sources.rules import with_rules


def tool_id_of(source: SourceDefinition, operation: HttpOperation) -> str:
    """The manifest id an operation declares, else ``http__{source}__{operation_id}``."""
    return operation.tool_id or http_tool_id(source.name, operation.operation_id)


def source_tool(source: SourceDefinition, operation: HttpOperation) -> SourceTool:
    """One operation of the HTTP source ``source`` as a tool, with the operator's rules."""
    found = SourceTool(
        tool_id=tool_id_of(source, operation),
        version=schema_version(operation.input_schema, operation.output_schema),
        source=source.name,
        source_type="http",
        tenant_id=source.tenant_id,
        remote_name=operation.operation_id,
        description=operation.description,
        effect=UNVOUCHED_EFFECT,  # with_rules applies an operator's declared effect
        hints=operation.hints,
        input_schema=operation.input_schema,
        output_schema=operation.output_schema,
        redaction_allowlist=[],
        timeout_seconds=source.timeout_s,
    )
    return with_rules(source, found)


def declared_tools(source: SourceDefinition) -> list[SourceTool]:
    """Every tool of an HTTP source; none for an MCP source (only its server knows)."""
    if source.kind is not SourceKind.HTTP:
        return []
    return [source_tool(source, op) for op in source.operations]
