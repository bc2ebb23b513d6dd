"""Supervised MCP sessions, one per server: started on demand, restarted, closed when idle.

The ``mcp`` SDK's transports must be opened and closed by one task, so each server's
session lives in a supervisor task (:meth:`ServerSession._supervise`): it opens the
session (starting a stdio server's process), keeps it while calls use it, reopens it
with exponential backoff when it breaks (a crashed server), and closes it once no call
has used it for the source's ``idle_s``. Calls wait for a live session up to their own
timeout.

With a ``launcher`` (the executor's :class:`~toolfleet.isolation.stdio.StdioSandbox`)
a stdio server's process runs sandboxed: the source's ``filesystem_permissions`` and
``network_permissions`` are all it sees of the host and the network.

A stdio server is read off the event loop, each message capped at the source's
``max_response_bytes`` (:mod:`toolfleet.sources.stdio_client`): a call answered over
the cap fails ``result_too_large`` (not retryable) and the session is restarted.

A call that loses its session mid-flight fails with ``external_api_error``
(retryable): the server crashed, a retry reaches the restarted one. Cancelling a call's
task makes the SDK send ``notifications/cancelled`` for its request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import time
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from toolfleet.errors import (
    ExternalApiError,
    ResultTooLarge,
    ResultValidationFailed,
    ToolfleetError,
)
from toolfleet.isolation.stdio import StdioServer
from toolfleet.sources.models import LISTING_LIMITS, ListingLimits, SourceDefinition, SourceKind

if TYPE_CHECKING:
    # The MCP SDK (with starlette, uvicorn and httpx2 under it) is imported where a session
    # opens, not with this module: an executor whose tenants declare no MCP source, and
    # every worker that only builds a SessionPool, never pays its tens of MB.
    import httpx2
    from mcp import Client
    from mcp.client import Transport
    from mcp.client.stdio import StdioServerParameters
    from mcp.shared.dispatcher import ProgressFnT
    from mcp.types import CallToolResult, Tool

    from toolfleet.sources.stdio_client import StdioConnection

log = logging.getLogger(__name__)

ToolsChanged = Callable[[SourceDefinition], Coroutine[Any, Any, None]]


#: Resolves a source's own credentials (credential name → value) when a session opens.
SourceCredentials = Callable[[SourceDefinition], Coroutine[Any, Any, dict[str, str]]]


class StdioLauncher(Protocol):
    """Wraps a stdio server's command (a sandbox); the context lives as long as its process."""

    def launch(self, server: StdioServer) -> AbstractAsyncContextManager[list[str]]: ...


def server_of(
    source: SourceDefinition,
    credentials: dict[str, str] | None = None,
    http_client: httpx2.AsyncClient | None = None,
    argv: list[str] | None = None,
) -> StdioServerParameters | str | Transport:
    """What ``mcp.Client`` connects to for ``source``.

    A stdio server's process gets the SDK's safe default environment plus
    ``credential_env``; an HTTP server's session sends ``credential_headers`` (through
    ``http_client``). Nothing else of the executor's environment reaches either.
    """
    from mcp.client.stdio import StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    values = credentials or {}
    if source.kind is SourceKind.MCP_HTTP:
        if http_client is None:
            return source.target
        return streamable_http_client(source.target, http_client=http_client)
    argv = argv or shlex.split(source.target)
    if not argv:
        raise ValueError(f"source {source.name}: empty command")
    env = {var: values[name] for var, name in source.credential_env.items() if name in values}
    return StdioServerParameters(command=argv[0], args=argv[1:], env=env or None)


class ServerLost(ExternalApiError):
    """The MCP server's session broke (crash, closed pipe): retryable, it is restarted."""


@dataclass(kw_only=True)
class ServerSession:
    """One MCP server's supervised session (see the module docstring)."""

    source: SourceDefinition
    on_tools_changed: ToolsChanged | None = None
    credentials: SourceCredentials | None = None
    """Resolves ``credential_env`` / ``credential_headers`` when a session opens."""
    launcher: StdioLauncher | None = None
    """Starts a stdio server sandboxed; None: as a plain child process."""
    max_backoff_s: float = 5.0
    clock: Callable[[], float] = time.monotonic
    starts: int = 0
    """Sessions opened so far (a restart after a crash counts)."""
    _client: Client | None = None
    _stdio: StdioConnection | None = None
    """The open stdio transport (it says whether the server sent a message over the cap)."""
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    _broken: asyncio.Event = field(default_factory=asyncio.Event)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _open_failed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while the last attempt to open a session failed (until the next one opens)."""
    _task: asyncio.Task[None] | None = None
    _side_tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _retired: bool = False
    _in_flight: int = 0
    _last_used: float = 0.0

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        progress: ProgressFnT | None = None,
    ) -> CallToolResult:
        """``tools/call``; the caller bounds it (a timeout or cancel sends cancelled)."""
        self._in_flight += 1
        client: Client | None = None
        try:
            client = await self._session()
            return await client.call_tool(name, arguments, progress_callback=progress)
        except (asyncio.CancelledError, TimeoutError):
            raise
        except RuntimeError as exc:
            if "structured content" not in str(exc):
                raise
            # The SDK checked the answer against the tool's output schema: the server is
            # alive and answered, badly. Its text stays here (it may quote the result).
            raise ResultValidationFailed(
                f"the MCP server {self.source.name} answered {name} with a malformed result"
            ) from None
        except Exception as exc:
            from mcp.shared.exceptions import MCPError

            from toolfleet.sources.stdio_client import TOO_LARGE_CODE

            stdio = self._stdio
            self._discard(client)
            too_large = stdio.overflow if stdio is not None else None
            # The session ended on a message over the cap: the call it answers fails typed
            # (every call in flight, when the message did not say which it answers).
            if too_large is not None and (
                too_large.request_id is None
                or (isinstance(exc, MCPError) and exc.code == TOO_LARGE_CODE)
            ):
                raise ResultTooLarge(
                    f"the MCP server {self.source.name} answered {name} with a message over "
                    f"{too_large.limit} bytes; its session was restarted",
                    details={"source": self.source.name, "max_bytes": too_large.limit},
                ) from None
            raise ServerLost(
                f"the MCP server {self.source.name} failed during {name}: {type(exc).__name__}",
                retry_after_s=1.0,
            ) from None
        finally:
            self._in_flight -= 1
            self._last_used = self.clock()

    async def list_tools(self, limits: ListingLimits = LISTING_LIMITS) -> list[Tool]:
        """Every tool the server lists now (all pages), within ``limits``.

        Raises:
            ResultTooLarge: more tools, bytes or pages than ``limits`` allow, or one
                message over the source's ``max_response_bytes`` (the session restarts).
            ResultValidationFailed: the answer is not a tool listing.
            ServerLost: the server could not be started or reached, or broke.
        """
        self._in_flight += 1
        client: Client | None = None
        try:
            client = await self._session()
            tools: list[Tool] = []
            size = 0
            cursor: str | None = None
            for _ in range(limits.max_pages):
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                tools.extend(page.tools)
                size += len(page.model_dump_json(by_alias=True, exclude_none=True))
                if len(tools) > limits.max_tools or size > limits.max_bytes:
                    raise self._too_large(
                        f"more than {limits.max_tools} tools or {limits.max_bytes} bytes",
                        limits,
                    )
                cursor = page.next_cursor
                if cursor is None:
                    return tools
            raise self._too_large(f"more than {limits.max_pages} pages", limits)
        except (asyncio.CancelledError, TimeoutError, ToolfleetError):
            raise
        except ValidationError:
            # Alive, and answering with something that is not a listing.
            self._discard(client)
            raise ResultValidationFailed(
                f"the MCP server {self.source.name} answered tools/list with a malformed listing"
            ) from None
        except Exception as exc:
            stdio = self._stdio
            self._discard(client)
            if stdio is not None and stdio.overflow is not None:
                raise ResultTooLarge(
                    f"the MCP server {self.source.name} answered tools/list with a message "
                    f"over {stdio.overflow.limit} bytes; its session was restarted",
                    details={"source": self.source.name, "max_bytes": stdio.overflow.limit},
                ) from None
            raise ServerLost(
                f"the MCP server {self.source.name} failed to list its tools: {type(exc).__name__}",
                retry_after_s=1.0,
            ) from None
        finally:
            self._in_flight -= 1
            self._last_used = self.clock()

    def _too_large(self, what: str, limits: ListingLimits) -> ResultTooLarge:
        return ResultTooLarge(
            f"the MCP server {self.source.name} lists {what}",
            details={
                "source": self.source.name,
                "max_tools": limits.max_tools,
                "max_bytes": limits.max_bytes,
                "max_pages": limits.max_pages,
            },
        )

    def close_when_idle(self) -> None:
        """Stop at the next idle check, whatever ``idle_s`` says (a replaced session)."""
        self._retired = True

    async def close(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def _session(self) -> Client:
        """The live session; a server that cannot be started or reached fails at once."""
        if not self.running:
            self._stop.clear()
            self._open_failed.clear()
            self._task = asyncio.create_task(
                self._supervise(), name=f"mcp-source-{self.source.name}"
            )
        while True:
            if self._ready.is_set() and self._client is not None:
                return self._client
            if self._open_failed.is_set():
                raise ServerLost(
                    f"the MCP server {self.source.name} could not be started or reached",
                    retry_after_s=1.0,
                )
            waits = [
                asyncio.ensure_future(self._ready.wait()),
                asyncio.ensure_future(self._open_failed.wait()),
            ]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()

    def _discard(self, client: Client | None) -> None:
        if client is not None and client is self._client:
            self._client = None
            self._ready.clear()
            self._broken.set()

    async def _on_message(self, message: object) -> None:
        """Handshake-era servers send ``notifications/tools/list_changed``."""
        from mcp.types import ToolListChangedNotification

        if isinstance(message, ToolListChangedNotification):
            self._tools_changed()

    def _tools_changed(self) -> None:
        if self.on_tools_changed is not None:
            # Not awaited here: listing tools from inside the SDK's message loop deadlocks.
            task = asyncio.get_running_loop().create_task(self.on_tools_changed(self.source))
            self._side_tasks.add(task)
            task.add_done_callback(self._side_tasks.discard)

    async def _listen(self, client: Client) -> None:
        """2026-07-28 servers announce list changes on a ``subscriptions/listen`` stream."""
        from mcp.client.subscriptions import ListenNotSupportedError

        try:
            async with client.listen(tools_list_changed=True) as changes:
                async for _ in changes:
                    self._tools_changed()
        except ListenNotSupportedError:
            return  # an older server: its notifications reach ``_on_message``
        except Exception as exc:  # the session is going away; the supervisor sees it
            log.debug("mcp source listen ended", extra={"error": type(exc).__name__})

    def _idle(self) -> bool:
        idle_s = 0.0 if self._retired else self.source.idle_s
        return self._in_flight == 0 and self.clock() - self._last_used >= idle_s

    async def _supervise(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            self._broken.clear()
            opened = False
            try:
                async with AsyncExitStack() as stack:
                    client = await stack.enter_async_context(await self._client_of(stack))
                    self.starts += 1
                    opened = True
                    self._open_failed.clear()
                    self._client = client
                    self._last_used = self.clock()
                    self._ready.set()
                    backoff = 0.1
                    listening = asyncio.create_task(self._listen(client))
                    try:
                        await self._hold()
                    finally:
                        listening.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await listening
                    if not self._broken.is_set():
                        log.info("mcp source idle: closed", extra={"source": self.source.name})
                        return  # stopped or idle: the next call starts it again
            except Exception as exc:  # any transport failure: reopen, never die
                if not opened:
                    self._open_failed.set()  # waiting calls fail now, not at their timeout
                log.warning(
                    "mcp source session failed; restarting",
                    extra={
                        "source": self.source.name,
                        "error": type(exc).__name__,
                        "retry_in_s": backoff,
                    },
                )
            finally:
                self._ready.clear()
                self._client = None
            if not opened and self._in_flight == 0:
                return  # unreachable and nobody waiting: the next call tries again
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=backoff)
            backoff = min(backoff * 2, self.max_backoff_s)

    async def _client_of(self, stack: AsyncExitStack) -> Client:
        """An unopened client of the server, its credentials resolved now."""
        import httpx2
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        from toolfleet.sources.stdio_client import StdioConnection

        source = self.source
        names = {*source.credential_env.values(), *source.credential_headers.values()}
        values = await self.credentials(source) if names and self.credentials else {}
        missing = names - set(values)
        if missing:
            raise ServerLost(
                f"the credentials of source {source.name} are not available", retry_after_s=5.0
            )
        http_client = None
        if source.kind is SourceKind.MCP_HTTP and source.credential_headers:
            headers = {h: values[name] for h, name in source.credential_headers.items()}
            http_client = await stack.enter_async_context(
                httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300))
            )
        argv = None
        if source.kind is SourceKind.MCP_STDIO and self.launcher is not None:
            command = shlex.split(source.target)
            if not command:
                raise ValueError(f"source {source.name}: empty command")
            argv = await stack.enter_async_context(
                self.launcher.launch(
                    StdioServer(
                        key=f"source:{source.tenant_id}:{source.name}",
                        tenant_id=source.tenant_id,
                        argv=command,
                        filesystem_permissions=source.filesystem_permissions,
                        network_permissions=source.network_permissions,
                    )
                )
            )
        server = server_of(source, values, http_client, argv)
        if isinstance(server, StdioServerParameters):
            # Not the SDK's stdio client: it reads on the event loop, uncapped.
            self._stdio = StdioConnection(
                server=server, max_message_bytes=source.max_response_bytes
            )
            server = self._stdio
        return Client(
            server,
            read_timeout_seconds=None,
            message_handler=self._on_message,
            cache=None,
        )

    async def _hold(self) -> None:
        """Until stopped, broken, or idle for ``idle_s``."""
        tick = min(1.0, self.source.idle_s / 4)
        while not (self._stop.is_set() or self._broken.is_set() or self._idle()):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._broken.wait(), timeout=tick)


@dataclass(kw_only=True)
class SessionPool:
    """The executor's sessions, one per (tenant, source); sessions are made on first use."""

    on_tools_changed: ToolsChanged | None = None
    credentials: SourceCredentials | None = None
    launcher: StdioLauncher | None = None
    """Starts stdio servers sandboxed (the executor sets it when it can run sandboxes)."""
    max_backoff_s: float = 5.0
    _sessions: dict[tuple[str, str], ServerSession] = field(default_factory=dict)
    _retiring: list[ServerSession] = field(default_factory=list)
    """Sessions let go of that may still run calls (closed with the pool at the latest)."""

    def discard(self, source: SourceDefinition) -> None:
        """Let go of ``source``'s session (a listing it failed): it stops once its calls
        end, and the next call opens a new one."""
        found = self._sessions.pop((source.tenant_id, source.name), None)
        if found is not None:
            self._retire(found)

    def _retire(self, session: ServerSession) -> None:
        session.close_when_idle()
        self._retiring = [s for s in self._retiring if s.running]  # the stopped ones: gone
        self._retiring.append(session)

    def session(self, source: SourceDefinition) -> ServerSession:
        key = (source.tenant_id, source.name)
        found = self._sessions.get(key)
        if found is not None and found.source != source:
            # The operator changed the source: the old session ends once its calls do.
            self._retire(found)
            found = None
        if found is None:
            found = ServerSession(
                source=source,
                on_tools_changed=self.on_tools_changed,
                credentials=self.credentials,
                launcher=self.launcher,
                max_backoff_s=self.max_backoff_s,
            )
            self._sessions[key] = found
        return found

    async def close(self) -> None:
        sessions = [*self._sessions.values(), *self._retiring]
        self._sessions, self._retiring = {}, []
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
