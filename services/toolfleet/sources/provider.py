"""Source tools for the executor: a :class:`ToolSpec` per ``(tool_id, version)`` on demand.

The executor asks its tool providers for a tool its catalog does not hold
(:class:`toolfleet.executor.ports.ToolProvider`); this one answers for the tools the
sources store holds (``mcp__*`` ids, and HTTP tools under their manifest ids). The
spec's function checks the caller's tenant may use the source, validates the parameters
against the tool's input schema, and calls the MCP server (through the supervised
:class:`SessionPool`) or the HTTP API.

MCP progress becomes checkpoints (progress events); a fleet cancel cancels the MCP
request, which makes the SDK send ``notifications/cancelled``.

:class:`SourceCatalog` lists a source's tools for the executor's listing job
(:func:`listing_job`, :mod:`toolfleet.sources.listing`) and on a server's
``list_changed``: only executors start or reach sources, never the API.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import asyncpg
from pydantic import BaseModel, ConfigDict, ValidationError

from toolfleet.bus.emitter import Emitter
from toolfleet.errors import (
    Cancelled,
    InvalidParameters,
    PermissionDenied,
    ResultValidationFailed,
    ToolNotFound,
)
from toolfleet.events.envelope import new_event
from toolfleet.events.models import Effect, SourceToolAdded
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.isolation.egress import Resolver, SystemResolver
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.secrets.store import SecretStore
from toolfleet.sources.declared import declared_tools
from toolfleet.sources.listing import ListingJob, bounded_listing
from toolfleet.sources.models import (
    GLOBAL_TENANT,
    LISTING_LIMITS,
    Discovery,
    ListingLimits,
    SourceDefinition,
    SourceKind,
    SourceTool,
)
from toolfleet.sources.pool import SessionPool, SourceCredentials
from toolfleet.sources.store import ListingStore, RecordedTools, SourceStore
from toolfleet.tools.context import ToolContext
from toolfleet.tools.limits import Isolation
from toolfleet.tools.spec import ToolSpec

log = logging.getLogger(__name__)

#: How often a running MCP call looks at the fleet's cancel flag.
CANCEL_POLL_S = 0.05


class SourceInput(BaseModel):
    """Parameters of a source tool: checked against its JSON Schema, not a model."""

    model_config = ConfigDict(extra="allow")


class SourceOutput(BaseModel):
    model_config = ConfigDict(extra="allow")


class SourceToolLookup(Protocol):
    """Where a source tool and its source are found (:class:`SourceStore`)."""

    async def tool(
        self, tool_id: str, version: str
    ) -> tuple[SourceTool, SourceDefinition] | None: ...


class SourceAudit(Protocol):
    """Told when a server adds a tool at run time (registered, disabled until named)."""

    async def tool_appeared(self, tool: SourceTool) -> None: ...


class LoggedSourceAudit:
    """:class:`SourceAudit` as a warning in the structured log."""

    async def tool_appeared(self, tool: SourceTool) -> None:
        self.tool_appeared_now(tool)

    def tool_appeared_now(self, tool: SourceTool) -> None:
        log.warning(
            "a source added a tool at run time; it stays disabled until a policy names it",
            extra={"source": tool.source, "tool_id": tool.tool_id, "version": tool.version},
        )


@dataclass(kw_only=True)
class SourceToolProvider:
    """:class:`toolfleet.executor.ports.ToolProvider` of every source tool."""

    lookup: SourceToolLookup
    pool: SessionPool = field(default_factory=SessionPool)
    resolver: Resolver = field(default_factory=SystemResolver)
    """Resolves an HTTP tool's host once per call (the address checked is the one used)."""
    ssl_context: ssl.SSLContext | None = None
    """TLS settings of HTTP tools (default: the system's CAs, made on first use)."""
    schemas: CompiledSchemas = field(default_factory=CompiledSchemas)
    network_permissions: Callable[[ToolContext], Sequence[str] | None] = lambda ctx: None
    """The call's granted hosts, from its execution grant (policy signs the token's
    ``network_permissions`` into it). None (no grant read for the call) reaches no host."""

    async def spec(self, tool_id: str, version: str) -> ToolSpec | None:
        found = await self.lookup.tool(tool_id, version)
        if found is None:
            return None
        tool, source = found

        async def run(params: SourceInput, ctx: ToolContext) -> dict[str, Any]:
            return await self._run(tool, source, params.model_dump(), ctx)

        return ToolSpec(
            tool_id=tool.tool_id,
            version=tool.version,
            effect=Effect(tool.effect),
            fn=run,
            input_model=SourceInput,
            output_model=SourceOutput,
            redaction_allowlist=tuple(tool.redaction_allowlist),
            timeout_seconds=tool.timeout_seconds,
            description=tool.description,
            credentials=tuple(dict.fromkeys(source.credential_headers.values())),
            input_schema=tool.input_schema,
            output_schema=tool.output_schema,
            circuit=f"source:{source.name}",
            # The call itself is I/O from the executor's supervised session pool (or an HTTP
            # request pinned to a granted address); what runs foreign code is the source's
            # server process, and that is where isolation applies.
            isolation=Isolation.NONE,
        )

    async def close(self) -> None:
        await self.pool.close()

    async def _run(
        self,
        tool: SourceTool,
        source: SourceDefinition,
        parameters: dict[str, Any],
        ctx: ToolContext,
    ) -> dict[str, Any]:
        if source.tenant_id not in (GLOBAL_TENANT, ctx.tenant_id):
            raise PermissionDenied(f"the source {source.name} belongs to another tenant")
        errors = self.schemas.errors(tool.input_schema, parameters)
        if errors:
            raise InvalidParameters(
                "parameters do not match the tool's input schema", details={"errors": errors}
            )
        if source.kind is SourceKind.HTTP:
            return await self._run_http(tool, source, parameters, ctx)
        return await self._run_mcp(tool, source, parameters, ctx)

    async def _run_mcp(
        self,
        tool: SourceTool,
        source: SourceDefinition,
        parameters: dict[str, Any],
        ctx: ToolContext,
    ) -> dict[str, Any]:
        session = self.pool.session(source)

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            percent = 100.0 * progress / total if total else 0.0
            await ctx.checkpoint({"mcp_progress": progress}, percent, message or "")

        call = asyncio.ensure_future(
            session.call(tool.remote_name, parameters, progress=on_progress)
        )
        try:
            while not call.done():
                await asyncio.wait({call}, timeout=CANCEL_POLL_S)
                if ctx.cancelled and not call.done():
                    call.cancel()  # the SDK sends notifications/cancelled for the request
                    await asyncio.gather(call, return_exceptions=True)
                    raise Cancelled("cancelled while running")
        finally:
            if not call.done():
                call.cancel()  # timeout or forced cancel: the server is told too
                await asyncio.gather(call, return_exceptions=True)
        try:
            answer = call.result()
        except ValidationError:
            raise ResultValidationFailed(
                f"{tool.tool_id}: the MCP server answered with a malformed result"
            ) from None
        # Imported with the call: the MCP SDK is loaded only by an executor that runs one.
        from toolfleet.sources import mcp_tools

        return mcp_tools.result_of(tool, answer)

    async def _run_http(
        self,
        tool: SourceTool,
        source: SourceDefinition,
        parameters: dict[str, Any],
        ctx: ToolContext,
    ) -> dict[str, Any]:
        operation = next(
            (op for op in source.operations if op.operation_id == tool.remote_name), None
        )
        if operation is None:
            raise ToolNotFound(f"the source {source.name} no longer has {tool.remote_name}")
        # Imported with the call: httpx is loaded only by an executor that runs HTTP tools.
        import httpx

        from toolfleet.sources import http_tools

        if source.credential_headers and ctx.connection_id != source.connection_id:
            raise PermissionDenied(
                f"the source {source.name} takes its credentials from connection "
                f"{source.connection_id!r}"
            )
        headers = {
            header: ctx.credential(credential).reveal()
            for header, credential in source.credential_headers.items()
        }
        request = http_tools.build_request(source, operation, parameters, headers)
        # No grant read for this call (None) grants no host: the check is never skipped.
        granted = self.network_permissions(ctx) or ()
        address = await http_tools.check_host(request, granted, ctx.tenant_id, self.resolver)
        http_tools.pin(request, address)
        if self.ssl_context is None:
            self.ssl_context = httpx.create_ssl_context()
        # One connection per call: a pooled one could carry this call to an address
        # checked for another call's grant, or under another name's certificate.
        # No proxy from the environment either: it would resolve the name again.
        async with httpx.AsyncClient(
            verify=self.ssl_context, follow_redirects=False, trust_env=False
        ) as client:
            response = await http_tools.send(client, request, tool)
            try:
                http_tools.check_status(tool, response)
                body = await http_tools.read_body(tool, response, source.max_response_bytes)
            finally:
                await response.aclose()
        return http_tools.parse_body(tool, body)


@dataclass(kw_only=True)
class SourceCatalog:
    """Lists sources' tools and records them: the executor's side of a listing the API
    asked for (:class:`~toolfleet.sources.listing.ListingJob`), and a server's
    ``list_changed``; every listing bounded by
    :func:`~toolfleet.sources.listing.bounded_listing`."""

    store: SourceStore
    pool: SessionPool
    audit: SourceAudit = field(default_factory=LoggedSourceAudit)
    after_record: Callable[[RecordedTools], Awaitable[None]] | None = None
    limits: ListingLimits = LISTING_LIMITS
    worker: str = "executor"
    """Who lists (``listed_by``): the executor's worker id once :func:`listing_job` runs."""

    async def listed(self, source: SourceDefinition) -> list[SourceTool]:
        """The tools ``source`` offers now: an HTTP source's declared operations, an MCP
        server's answer (through the pool's session, within ``limits``). A session that
        failed a listing (or ran out of time) is let go of: the next call opens another."""
        if source.kind is SourceKind.HTTP:
            return declared_tools(source)
        from toolfleet.sources import mcp_tools  # with the MCP SDK, once a listing needs it

        try:
            answer = await self.pool.session(source).list_tools(self.limits)
            return [mcp_tools.source_tool(source, tool) for tool in answer]
        except BaseException:
            self.pool.discard(source)
            raise

    async def record(self, tools: list[SourceTool], *, via: Discovery) -> RecordedTools:
        recorded = await self.store.record(tools, via=via)
        for name in sorted({t.source for t in tools}):
            # Rules an operator set while the source was being listed apply too.
            await self.store.restate_rules(name)
        if via == "list_changed":
            for tool in recorded.new_tools:
                await self.audit.tool_appeared(tool)
        if self.after_record is not None:
            await self.after_record(recorded)
        return recorded

    async def refresh(self, source: SourceDefinition, *, via: Discovery = "add") -> RecordedTools:
        """List ``source`` now (bounded), record what it lists, and mark its listing
        ready when ``source`` is what is stored (outside the listing queue: a server's
        ``list_changed``)."""
        tools = await bounded_listing(self, source, self.limits)
        recorded = await self.record(tools, via=via)
        await self.store.listings.listed_now(source, tools=len(tools), by=self.worker)
        return recorded

    async def on_tools_changed(self, source: SourceDefinition) -> None:
        """The ``notifications/tools/list_changed`` handler of the pool's sessions: the
        session that heard it lists again (its server holds the change)."""
        current = await self.store.get(source.name)
        if current is None:
            return
        try:
            await self.refresh(current, via="list_changed")
        except Exception as exc:  # a notification handler must not die
            log.warning(
                "relisting a source's tools failed",
                extra={"source": source.name, "error": type(exc).__name__},
            )


def listing_job(
    catalog: SourceCatalog, pool: asyncpg.Pool, worker: str
) -> Callable[[asyncio.Event], Coroutine[Any, Any, None]]:
    """The executor's background job that lists sources' tools as the API asks
    (:class:`~toolfleet.sources.listing.ListingJob` over ``source_listings``)."""
    catalog.worker = worker
    job = ListingJob(queue=ListingStore(pool), lister=catalog, worker=worker, limits=catalog.limits)
    return job.run


#: Namespace of the ids of ``source.tool_added`` events: one id per tool version, so
#: executors that all saw the same ``list_changed`` publish one audited fact.
_TOOL_ADDED_IDS = uuid.UUID("0b6c8f3e-5d41-4a8e-9a57-7f3c2e1d9b64")

#: Tenant (message key) of events about a source that serves every tenant.
FLEET_TENANT = "toolfleet"


def secret_credentials(store: SecretStore) -> SourceCredentials:
    """A source's own credentials from the executor's secret store: the source's tenant
    (``toolfleet`` for a global source) and ``connection_id``."""

    async def resolve(source: SourceDefinition) -> dict[str, str]:
        if source.connection_id is None:
            return {}
        tenant = FLEET_TENANT if source.tenant_id == GLOBAL_TENANT else source.tenant_id
        names = {*source.credential_env.values(), *source.credential_headers.values()}
        return {
            name: (await store.resolve(tenant, source.connection_id, name)).reveal()
            for name in sorted(names)
        }

    return resolve


@dataclass(kw_only=True)
class EventSourceAudit:
    """:class:`SourceAudit` as an ``ai.agent.tool.source.tool_added`` event, which the
    audit service turns into an audit record like every lifecycle event."""

    emitter: Emitter

    async def tool_appeared(self, tool: SourceTool) -> None:
        LoggedSourceAudit().tool_appeared_now(tool)
        event = new_event(
            event_type=EventType.SOURCE_TOOL_ADDED,
            source=Source.EXECUTOR,
            data=SourceToolAdded(
                source=tool.source,
                source_tenant_id=tool.tenant_id,
                tool_id=tool.tool_id,
                tool_version=tool.version,
                at=datetime.now(UTC),
            ),
            tenant_id=FLEET_TENANT if tool.tenant_id == GLOBAL_TENANT else tool.tenant_id,
            invocation_id=None,
            event_id=str(uuid.uuid5(_TOOL_ADDED_IDS, f"{tool.tool_id}@{tool.version}")),
        )
        await (await self.emitter.emit(TopicName.EVENTS, event))
