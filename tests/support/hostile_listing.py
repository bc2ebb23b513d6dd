"""An MCP server (stdio) that answers ``tools/list`` the way MODE says: the listing
tests' hostile sources.

``python -m tests.support.hostile_listing MODE``:

- ``ok``: one honest tool ``add``, annotated ``readOnlyHint: true`` (not trusted).
- ``slow``: never answers ``tools/list``.
- ``huge``: one tool whose description is 4 MiB (one message over a 1 MiB cap).
- ``many``: 1,001 tools (one over the cap).
- ``endless``: every page names a next page.
- ``garbage``: answers ``{"tools": "garbage"}``, written around the SDK.
- ``clash``: two tools, ``a-b`` and ``a_b``, that would share one fleet tool id.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.types import ListToolsResult, PaginatedRequestParams, Tool, ToolAnnotations

#: The wire (stdout as it was at start): the SDK diverts fd 1 to stderr while it serves.
WIRE = os.dup(1)
OBJECT = {"type": "object"}


def tool(name: str, description: str = "") -> Tool:
    return Tool(name=name, description=description, input_schema=OBJECT)


class HostileLister(MCPServer):
    def __init__(self, mode: str) -> None:
        super().__init__(name=f"toolfleet-hostile-listing-{mode}")
        self.mode = mode

    async def _handle_list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        if self.mode == "slow":
            await anyio.sleep_forever()
        if self.mode == "huge":
            return ListToolsResult(tools=[tool("big", "A" * (4 * 1_048_576))])
        if self.mode == "many":
            return ListToolsResult(tools=[tool(f"t{i}") for i in range(1001)])
        if self.mode == "endless":
            page = int(params.cursor) if params and params.cursor else 0
            return ListToolsResult(tools=[tool(f"p{page}")], next_cursor=str(page + 1))
        if self.mode == "garbage":
            answer = {"jsonrpc": "2.0", "id": ctx.request_id, "result": {"tools": "garbage"}}
            os.write(WIRE, json.dumps(answer).encode() + b"\n")
            await anyio.sleep_forever()
        if self.mode == "clash":
            return ListToolsResult(tools=[tool("a-b"), tool("a_b")])
        honest = Tool(
            name="add",
            description="Add two integers.",
            input_schema=OBJECT,
            annotations=ToolAnnotations(readOnlyHint=True),
        )
        return ListToolsResult(tools=[honest])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "mode", choices=["ok", "slow", "huge", "many", "endless", "garbage", "clash"]
    )
    args = parser.parse_args(argv)
    HostileLister(args.mode).run("stdio")


if __name__ == "__main__":
    main()
