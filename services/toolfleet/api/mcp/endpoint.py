"""toolfleet as an MCP server: Streamable HTTP at ``/mcp``, stateless, bearer-token auth.

:class:`McpEndpoint` is the door: it checks the bearer token exactly as every HTTP
route does (:func:`~toolfleet.api.auth.verify_bearer`, revocation included) and hands
the request to the ``mcp`` SDK's stateless transport, which serves both the
handshake-era and the 2026 single-exchange protocol; :mod:`.handlers` answer. Nothing
is kept in process memory between requests, so replicas need no sticky sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

import toolfleet
from toolfleet.api.auth import verify_bearer
from toolfleet.api.mcp.calls import RedisCallIndex
from toolfleet.api.mcp.handlers import SCOPE_KEY, McpRequest, call_tool, list_tools, on_cancelled
from toolfleet.api.problems import ProblemError, problem_response
from toolfleet.api.resources import resources
from toolfleet.events.identity import valid_traceparent

MCP_PATH: Final = "/mcp"


class McpEndpoint:
    """The ASGI app at ``/mcp``: authenticate, then let the SDK's transport serve."""

    def __init__(self, manager: StreamableHTTPSessionManager) -> None:
        self._manager = manager

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        res = resources(request)
        try:
            caller = await verify_bearer(res, request.headers.get("authorization"))
        except ProblemError as exc:
            answer = problem_response(
                request, exc.status, exc.detail, code=exc.code, headers=exc.headers
            )
            await answer(scope, receive, send)
            return
        seen = McpRequest(
            res=res,
            caller=caller,
            calls=RedisCallIndex(res.redis),
            traceparent=valid_traceparent(request.headers.get("traceparent")),
        )
        await self._manager.handle_request({**scope, SCOPE_KEY: seen}, receive, send)


@dataclass(frozen=True, slots=True)
class McpService:
    """The MCP server of one API app: its endpoint, and the transport's lifetime."""

    server: Server[Any]
    manager: StreamableHTTPSessionManager

    @classmethod
    def create(cls) -> McpService:
        server = build_server()
        # Stateless: every POST stands alone, so any replica can take any request.
        # No DNS-rebinding host check: requests are authorized by bearer token only,
        # which a browser never attaches on its own.
        manager = StreamableHTTPSessionManager(app=server, stateless=True)
        return cls(server=server, manager=manager)

    @property
    def endpoint(self) -> McpEndpoint:
        return McpEndpoint(self.manager)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The transport's task group, for as long as the app serves.

        The group lives in a task of its own: an anyio task group must be left by the
        task that entered it, and whoever runs the app's lifespan (a server, a test
        fixture) may start and stop it from different tasks.
        """
        ready, stop = asyncio.Event(), asyncio.Event()

        async def serve() -> None:
            async with self.manager.run():
                ready.set()
                await stop.wait()

        task = asyncio.create_task(serve(), name="mcp-transport")
        started = asyncio.create_task(ready.wait())
        await asyncio.wait({task, started}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.is_set():
            started.cancel()
            await task  # raises what stopped the transport from starting
        try:
            yield
        finally:
            stop.set()
            await task


def build_server() -> Server[Any]:
    """The low-level MCP server with toolfleet's handlers."""
    server: Server[Any] = Server(
        "toolfleet",
        version=toolfleet.__version__,
        instructions=(
            "Tools run through the toolfleet pipeline: policy, approval, audit. A call "
            "that needs approval answers with an invocation handle; poll its `poll` path "
            "on the same API with the same bearer token."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )
    server.add_notification_handler(
        "notifications/cancelled", types.CancelledNotificationParams, on_cancelled
    )
    return server
