"""toolfleet as an MCP server (Streamable HTTP at ``/mcp``); see :mod:`.endpoint`."""

from toolfleet.api.mcp.endpoint import MCP_PATH, McpService

__all__ = ["MCP_PATH", "McpService"]
