"""Runs each attempt where its tool's spec says: the loop, a worker process, a sandbox.

The limits of an isolated run are the tool's, nested in its agent's (BC-1,
:func:`toolfleet.tools.limits.bound_limits`): a tool asking more than the request's
``resource_limits`` is refused before anything starts. The files and hosts a sandbox
sees come from policy's signed grant (:func:`sandbox_grants`), never from the event
alone. ``core__run_python`` and command tools run only in a sandbox.

An executor built without a runtime (``ExecutorPorts(isolation=None)``: unit tests,
embedding) runs every Python tool in its loop, and refuses those that must be
sandboxed (``sandbox_failure``). ``toolfleet worker executor`` always has a runtime.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pydantic import ValidationError

from toolfleet.auth.grants import ExecutionGrant
from toolfleet.bus.emitter import Emitter
from toolfleet.errors import InvalidParameters, SandboxFailure, ToolfleetError
from toolfleet.events.envelope import Envelope, field_errors, new_event
from toolfleet.events.models import EgressDecided, InvokeAuthorized
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.executor.runner import RunResult, run_tool
from toolfleet.isolation.egress import EgressGrant, EgressProxy, EgressRecord
from toolfleet.isolation.runtime import Grants, IsolatedCall, IsolationRuntime, RuntimeConfig
from toolfleet.isolation.sandbox import parse_filesystem_permissions
from toolfleet.isolation.stdio import StdioSandbox
from toolfleet.tools.context import ToolContext
from toolfleet.tools.limits import (
    AgentLimits,
    FleetLimits,
    Isolation,
    ManifestDefaults,
    bound_limits,
)
from toolfleet.tools.spec import ToolSpec

if TYPE_CHECKING:
    from toolfleet.executor.settings import ExecutorSettings

log = logging.getLogger(__name__)

#: Tools that never run outside a sandbox.
ALWAYS_SANDBOXED = frozenset({"core__run_python"})


def sandbox_grants(grant: ExecutionGrant | None, call: InvokeAuthorized) -> Grants:
    """The token's ``filesystem_permissions`` and ``network_permissions`` as policy
    signed them into the call's grant (verified by the executor's grant gate); none
    without a grant (nothing is widened).

    Raises:
        PermissionDenied: an entry cannot be read (the whole grant is refused).
    """
    if grant is None:
        return Grants()
    egress = None
    if grant.network_permissions:
        egress = EgressGrant.from_permissions(
            invocation_id=str(call.invocation_id),
            tenant_id=call.agent_context.tenant_id,
            network_permissions=grant.network_permissions,
        )
    return Grants(binds=parse_filesystem_permissions(grant.filesystem_permissions), egress=egress)


@dataclass(frozen=True, kw_only=True)
class IsolatedRunner:
    """The :data:`~toolfleet.executor.attempts.ToolRunner` of one call."""

    runtime: IsolationRuntime | None
    fleet: FleetLimits
    agent: AgentLimits
    grants: Grants

    async def __call__(
        self, spec: ToolSpec, parameters: dict[str, Any], ctx: ToolContext, timeout_s: float
    ) -> RunResult:
        isolation = spec.isolation
        if spec.tool_id in ALWAYS_SANDBOXED or spec.command:
            isolation = Isolation.SANDBOX
        elif self.runtime is None:
            isolation = Isolation.NONE  # an embedded executor (tests): see the docstring
        if isolation is Isolation.NONE:
            return await run_tool(spec, parameters, ctx, timeout_s=timeout_s)
        try:
            spec.input_model.model_validate(parameters)
        except ValidationError as exc:
            return RunResult(
                error=InvalidParameters(
                    "parameters do not match the tool's input model",
                    details={"errors": field_errors(exc)},
                ).to_error_info()
            )
        try:
            limits = bound_limits(
                tool_id=spec.tool_id,
                tool=spec.limits,
                agent=self.agent,
                fleet=self.fleet,
                timeout_s=timeout_s,
                defaults=ManifestDefaults(
                    memory_mb=spec.resource_defaults.memory_mb_limit,
                    cpu_millicores=spec.resource_defaults.cpu_millicore_limit,
                ),
            )
            if self.runtime is None:
                raise SandboxFailure(f"{spec.tool_id} needs isolation; this executor has none")
        except ToolfleetError as exc:
            return RunResult(error=exc.to_error_info())
        outcome = await self.runtime.run(
            IsolatedCall(
                isolation=isolation,
                tool_id=spec.tool_id,
                target=spec.target,
                command=spec.command,
                parameters=parameters,
                limits=limits,
                grants=self.grants,
                credentials=bool(spec.credentials),
            ),
            ctx,
        )
        return RunResult(result=outcome.result, error=outcome.error, usage=outcome.usage)


class EgressEvents:
    """The egress proxy's audit port: every record an ``ai.agent.tool.egress`` event on
    ``invoke.events`` (a child of its call's event, so it carries the call's trace),
    which audit turns into an audit event on ``toolfleet.audit``; also a log line.

    The executor registers a call in :attr:`parents` while its sandbox may connect."""

    def __init__(self, emitter: Emitter | None = None) -> None:
        self.emitter = emitter
        self.parents: dict[str, Envelope] = {}

    async def record(self, entry: EgressRecord) -> None:
        parent = self.parents.get(entry.invocation_id)
        if self.emitter is not None and parent is not None:
            event = new_event(
                event_type=EventType.EGRESS,
                source=Source.EXECUTOR,
                data=EgressDecided(
                    invocation_id=UUID(entry.invocation_id),
                    tenant_id=entry.tenant_id,
                    host=entry.host,
                    port=entry.port,
                    method=entry.method,
                    decision=entry.decision.value,
                    reason=entry.reason.value,
                    address=entry.address,
                    at=entry.at,
                ),
                tenant_id=entry.tenant_id,
                invocation_id=entry.invocation_id,
                parent=parent,
            )
            await (await self.emitter.emit(TopicName.EVENTS, event))
        log.info(
            "egress %s",
            entry.decision.value,
            extra={
                "invocation_id": entry.invocation_id,
                "tenant_id": entry.tenant_id,
                "host": entry.host,
                "port": entry.port,
                "method": entry.method,
                "decision": entry.decision.value,
                "reason": entry.reason.value,
                "address": entry.address,
            },
        )


def build_runtime(
    settings: ExecutorSettings, events: EgressEvents
) -> tuple[IsolationRuntime, FleetLimits, Callable[[asyncio.Event], Coroutine[Any, Any, None]]]:
    """The executor's runtime, its limits, and the background job that runs it."""
    proxy = EgressProxy(audit=events)
    runtime = IsolationRuntime(
        config=RuntimeConfig(
            warm_sandboxes=settings.isolation_warm_sandboxes,
            warm_processes=settings.isolation_warm_processes,
            fork_server=settings.isolation_fork_server,
            warm_tools=settings.isolation_warm_tools,
            max_workers=settings.isolation_max_workers,
            uid_base=settings.isolation_uid_base,
            workdir_mb=settings.isolation_max_file_mb,
        ),
        egress=proxy,
    )
    limits = FleetLimits(
        memory_mb=settings.isolation_memory_mb,
        cpu_millicores=settings.isolation_cpu_millicores,
        max_processes=settings.isolation_max_processes,
        max_file_mb=settings.isolation_max_file_mb,
        max_open_files=settings.isolation_max_open_files,
        max_output_bytes=settings.isolation_max_output_bytes,
        kill_grace_s=settings.isolation_kill_grace_s,
    )
    if not runtime.sandboxes:
        log.warning("sandboxed tools will fail here: %s", runtime.support.problem)

    async def run(stop: asyncio.Event) -> None:
        async with proxy, runtime:
            await stop.wait()

    return runtime, limits, run


def stdio_sandbox(
    settings: ExecutorSettings, runtime: IsolationRuntime, limits: FleetLimits
) -> StdioSandbox | None:
    """How the executor starts stdio MCP servers: sandboxed like a tool, under the uid
    just below the tools' range (when root); None where this host has no sandbox."""
    if not runtime.sandboxes:
        return None
    return StdioSandbox(
        support=runtime.support,
        limits=limits,
        egress=runtime.egress,
        uid=settings.isolation_uid_base - 1,
        workdir_mb=settings.isolation_max_file_mb,
    )
