"""The executor's work for one ``invoke.authorized`` event, over small ports.

Running: ``invoked`` is published before the tool starts, so pollers see ``running``.
The tool gets its last checkpoint's state (resume after a crash, on any worker) and a
context whose ``checkpoint()`` writes Redis (and Postgres, for durable checkpoints) and
publishes ``checkpoint.created``.
Cancellation is cooperative first (``ctx.cancelled``), then forced after a grace period.
A successful run goes on to the validator as ``invoke.executed``; a failed one ends
here as a terminal outcome.

Credentials: a tool that declares some needs the call's ``connection_id`` (policy has
checked the token grants it). Each credential is resolved from the secret store just
before the tool runs and reaches it only through ``ctx.credential(name)``, revoked when
the call returns. The result, error and checkpoints are then scanned for every resolved
value (and its base64); a call whose output carries one fails with ``redaction_failed``
and that output is never emitted, stored or logged.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from toolfleet.auth.grants import ExecutionGrant, GrantVerifier
from toolfleet.bus.emitter import Emitter
from toolfleet.documents.cache import DocumentCache
from toolfleet.documents.pins import MemoryPinBook, PinBook
from toolfleet.documents.reader import CallDocuments
from toolfleet.documents.source import DocumentSource
from toolfleet.errors import Cancelled, InvalidEvent, ResourceExhausted, ToolfleetError
from toolfleet.events.envelope import Emitted, Envelope
from toolfleet.events.identity import CallKey
from toolfleet.events.models import CancelRequested, ExecutionMetadata, InvokeAuthorized
from toolfleet.events.types import TopicName
from toolfleet.executor import outcomes
from toolfleet.executor.admission import (
    Cached,
    GatesPassed,
    HandedOver,
    Refused,
    Releases,
    RunGates,
    RunInput,
    Stop,
    check_grant,
    resume_point,
)
from toolfleet.executor.attempts import AttemptsInput, PendingReport, run_attempts
from toolfleet.executor.cache import ResultCache
from toolfleet.executor.checkpoints.sink import CheckpointSink
from toolfleet.executor.checkpoints.store import CheckpointStore
from toolfleet.executor.circuits.breaker import CircuitBreaker, Transition
from toolfleet.executor.concurrency import AgentSlots
from toolfleet.executor.isolated import EgressEvents, IsolatedRunner, sandbox_grants
from toolfleet.executor.leasing.guard import LeaseGuard, Suspended
from toolfleet.executor.pools import PoolRouter
from toolfleet.executor.ports import ToolProvider
from toolfleet.executor.result_transfer import ResultTransfer
from toolfleet.executor.runner import RunResult
from toolfleet.isolation.runtime import IsolationRuntime
from toolfleet.observability import metrics
from toolfleet.observability.tracing import (
    mark_failed,
    span,
    tool_span_attributes,
    tool_span_name,
)
from toolfleet.registry.catalog import ToolCatalog
from toolfleet.secrets.capability import LeakDetector
from toolfleet.secrets.store import SecretStore
from toolfleet.storage.cancel_flags import CancelFlags
from toolfleet.storage.revocation import RevocationList
from toolfleet.tools.context import ToolContext
from toolfleet.tools.limits import AgentLimits, FleetLimits

__all__ = [
    "Emitted",
    "ExecutorConfig",
    "ExecutorPorts",
    "ExecutorRunState",
    "ExecutorService",
]

log = logging.getLogger(__name__)


@dataclass
class _RunningCall:
    task: asyncio.Task[object]
    cancel_event: asyncio.Event
    tenant_id: str
    """Whose call it is: a cancel of another tenant's call of the same id stops nothing."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorPorts:
    """The executor's collaborators: stores, clients and the runtime, built at startup."""

    catalog: ToolCatalog
    checkpoints: CheckpointStore
    cancels: CancelFlags
    emitter: Emitter
    secrets: SecretStore | None = None
    """Where declared credentials are resolved; None refuses every tool that needs one."""
    grants: GrantVerifier | None = None
    """Verifies policy's execution grant before anything runs (defence in depth)."""
    revocations: RevocationList | None = None
    """Refuses a grant whose capability token was revoked after policy authorized it."""
    slots: AgentSlots | None = None
    """Bounds the calls one agent runs at once; None leaves them unbounded."""
    breaker: CircuitBreaker | None = None
    """Circuit breakers of the tools' circuits; None lets every call through."""
    cache: ResultCache | None = None
    """Result cache of tools that declare one; None runs every call."""
    results: ResultTransfer = field(default_factory=lambda: ResultTransfer(blobs=None))
    """How results leave: inline, or as a blob when large (no store: large ones fail)."""
    documents: DocumentSource | None = None
    """Where ``ctx.documents`` reads; None refuses every read (``document_source_unavailable``)."""
    document_cache: DocumentCache | None = None
    """Shared cache of document answers; None reads the source every time."""
    document_pins: PinBook = field(default_factory=MemoryPinBook)
    """Each call's version pins, kept beside its checkpoints so a resume finds them."""
    providers: tuple[ToolProvider, ...] = ()
    """Tools beyond the catalog (MCP and HTTP tool sources), asked in order."""
    lease_guard: LeaseGuard | None = None
    """Execution leases with fencing epochs; None runs without (one executor, tests)."""
    isolation: IsolationRuntime | None = None
    """Worker processes and sandboxes; None runs only ``isolation="none"`` tools."""
    egress_events: EgressEvents | None = None
    """Turns the egress proxy's records of this executor's calls into events."""
    pool_router: PoolRouter | None = None
    """Hands a call whose tool this executor lacks to an executor of its pool that has
    it (:mod:`toolfleet.executor.pools`); None: such a call fails ``tool_not_found``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorConfig:
    """The executor's knobs (from :class:`~toolfleet.executor.settings.ExecutorSettings`)."""

    worker_id: str
    cancel_grace_s: float = 5.0
    """How long a cancelled tool may stop by itself before its task is cancelled."""
    document_source_name: str = "default"
    """The name a request's ``document_context.source`` must match (or leave unset)."""
    trust_lease_reads: bool = False
    """Take the cancel flag and the hot checkpoint as the lease's script read them
    (:class:`~toolfleet.executor.leasing.leases.Seen`), instead of a round trip each:
    only when the leases, the cancel flags and the hot checkpoints share one Redis, as
    the handler builds them."""
    isolation_limits: FleetLimits = field(default_factory=FleetLimits)
    """Defaults and ceilings of isolated runs."""


@dataclass(slots=True)
class ExecutorRunState:
    """What changes while the executor runs; only its :class:`ExecutorService` writes it."""

    suspending: bool = False
    """Set at shutdown: tools stop at their next checkpoint, the call is handed over."""
    suspended_calls: set[str] = field(default_factory=set)
    """Calls whose partition was revoked: like ``suspending``, for those calls only."""
    running: dict[str, _RunningCall] = field(default_factory=dict)
    """The calls running here, by invocation id (a cancel finds them)."""
    network_grants: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Each running call's granted hosts (from its grant; absent: no grant verifier)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutorService:
    """The executor: its ports and configuration (fixed), and its run state (its own)."""

    ports: ExecutorPorts
    config: ExecutorConfig
    state: ExecutorRunState = field(default_factory=ExecutorRunState, compare=False)
    admission: RunGates = field(init=False, compare=False, repr=False)
    """The gates a call passes after the grant and the lease (built once: the ports
    they read are fixed)."""

    def __post_init__(self) -> None:
        gates = RunGates(
            catalog=self.ports.catalog,
            cancels=self.ports.cancels,
            checkpoints=self.ports.checkpoints,
            is_suspended=self.is_suspended,
            secrets=self.ports.secrets,
            slots=self.ports.slots,
            breaker=self.ports.breaker,
            cache=self.ports.cache,
            providers=self.ports.providers,
        )
        object.__setattr__(self, "admission", gates)  # frozen: set once, here

    def network_permissions(self, invocation_id: str) -> tuple[str, ...] | None:
        """The hosts a running call may reach, as policy signed them (None: unchecked)."""
        return self.state.network_grants.get(invocation_id)

    async def on_authorized(self, event: Envelope, *, pool: str | None = None) -> list[Emitted]:
        """Run one authorized call; every release is owned by one ``AsyncExitStack``.

        The stack is entered lease first, then whatever the gates acquire (credentials,
        the agent's slot), so it unwinds in reverse on every exit: an outcome, a refusal,
        a cancel, or an error (an emitter that fails included). ``pool``: the pool whose
        topic carried the event; a call whose tool this executor lacks goes to another
        executor of that pool (:attr:`pool_router`) instead of failing.
        """
        call = event.data_as(InvokeAuthorized)
        if pool is not None and call.pool != pool:
            # Policy publishes a call on its own pool's topic only, and the grant binds the
            # pool the event names: this is a copy someone with topic access moved. It is
            # not the call's delivery (that one runs in its pool), so it ends nothing.
            raise InvalidEvent(
                f"an authorized event of pool {call.pool!r} on pool {pool!r}'s topic"
            )
        unleased = RunInput(event=event, call=call)
        invocation_id = unleased.invocation_id
        verified: list[ExecutionGrant] = []

        def granted(grant: ExecutionGrant) -> None:
            verified.append(grant)
            self.state.network_grants[invocation_id] = grant.network_permissions

        stop = await check_grant(
            self.ports.grants, self.ports.revocations, unleased, granted=granted
        )
        if stop is not None:
            self.state.network_grants.pop(invocation_id, None)
            # A call that ended meanwhile (a queued call's deadline passed, then its grant
            # expired) keeps its one outcome: the recorded events go out again, same ids.
            ended = await self._finished(unleased)
            return ended if ended is not None else self._stopped(unleased, stop)
        # The grant is verified once, here: the run and its sandbox read what it says.
        unleased = replace(unleased, grant=verified[0] if verified else None)
        if (
            pool is not None
            and self.ports.pool_router is not None
            and await self.admission.find_tool(call) is None
        ):
            self.state.network_grants.pop(invocation_id, None)
            ended = await self._finished(unleased)  # ended already (its deadline passed)
            return (
                ended
                if ended is not None
                else await self.ports.pool_router.misrouted(event, call, pool)
            )
        acks: list[asyncio.Future[object]] = []
        reports: list[PendingReport] = []
        acknowledged: asyncio.Future[list[object]] | None = None
        try:
            async with AsyncExitStack() as stack:
                # The last to unwind: the releases started above it (the agent's slot)
                # run while the rest unwinds, the lease's finish included.
                releases = Releases()
                stack.push_async_callback(releases.wait)
                if self.ports.lease_guard is None:
                    outcome = await self._run(unleased, stack, acks, reports, releases)
                else:
                    held = await stack.enter_async_context(
                        self.ports.lease_guard.hold(
                            unleased.ref.key, stopping=lambda: self.is_suspended(invocation_id)
                        )
                    )
                    if held.replay is not None:
                        return held.replay
                    seen = held.seen if self.config.trust_lease_reads else None
                    run = replace(unleased, fence=held.fence, seen=seen)
                    # Claimed with finish() as the lease's hold ends.
                    held.outcome = outcome = await self._run(run, stack, acks, reports, releases)
                # The acks of what the run published, and its last report to the tool's
                # circuit, are awaited while the stack unwinds (the slot's release, the
                # lease's finish): not one after the other.
                acknowledged = asyncio.gather(*acks)
            await acknowledged
            while reports:
                await reports.pop().settle()  # answered by now: it overlapped the finish
            return outcome
        finally:
            if acknowledged is None or not acknowledged.done():
                _retrieve_later(acknowledged, acks)
            for report in reports:  # not settled: the run failed on its way
                report.drop()
            self.state.suspended_calls.discard(invocation_id)
            self.state.network_grants.pop(invocation_id, None)

    async def _finished(self, run: RunInput) -> list[Emitted] | None:
        """The recorded events of the call if it finished (None: it did not, or no leases)."""
        if self.ports.lease_guard is None:
            return None
        record = await self.ports.lease_guard.leases.finished(run.ref.key)
        return None if record is None else [(e.topic, e.envelope) for e in record.events]

    def suspend(self) -> None:
        """Shutting down: running tools stop at their next checkpoint and are handed over."""
        self.state.suspending = True

    def suspend_calls(self, invocation_ids: set[str]) -> None:
        """These calls' partitions moved away: hand them over at their next checkpoint."""
        self.state.suspended_calls |= invocation_ids

    def is_suspended(self, invocation_id: str) -> bool:
        return self.state.suspending or invocation_id in self.state.suspended_calls

    async def _run(
        self,
        run: RunInput,
        stack: AsyncExitStack,
        acks: list[asyncio.Future[object]],
        reports: list[PendingReport],
        releases: Releases,
    ) -> list[Emitted]:
        """Admit the call, run its tool, and build its outcome (releases: ``stack``, and
        ``releases`` for those that may overlap the lease's finish).

        The acks of the events published on the way (``invoked``, checkpoints) are left
        in ``acks``, the last attempt's report to the tool's circuit in ``reports``: the
        caller waits for both before the outcome leaves.
        """
        admitted = await self.admission.admit(run, stack, releases)
        if not isinstance(admitted, GatesPassed):
            return self._stopped(run, admitted)
        spec, call, invocation_id = admitted.tool, run.call, run.invocation_id
        try:
            runner = IsolatedRunner(
                runtime=self.ports.isolation,
                fleet=self.config.isolation_limits,
                agent=AgentLimits(
                    memory_mb=call.resource_limits.memory_mb_limit,
                    cpu_millicores=call.resource_limits.cpu_millicore_limit,
                ),
                grants=sandbox_grants(run.grant, call),
            )
        except ToolfleetError as exc:
            return self._stopped(run, Refused(error=exc))
        if self.ports.egress_events is not None and runner.grants.egress is not None:
            self.ports.egress_events.parents[invocation_id] = run.event
            stack.callback(self.ports.egress_events.parents.pop, invocation_id, None)
        resume = admitted.resume
        resumed_from = resume.checkpoint_id if resume else None
        capability = admitted.capability
        leaks = capability.detector() if capability is not None else LeakDetector(())
        started_at = datetime.now(UTC)
        # Not awaited here: the tool starts at once; every ack is awaited before the outcome.
        invoked_ack = await self.ports.emitter.emit(
            TopicName.EVENTS,
            outcomes.invoked(
                run,
                worker_id=self.config.worker_id,
                started_at=started_at,
                resumed_from=resumed_from,
            ),
        )
        cancel_event = asyncio.Event()
        documents = CallDocuments(
            context=call.document_context,
            source=self.ports.documents,
            pins=self.ports.document_pins(run.ref.key),
            cache=self.ports.document_cache,
            source_name=self.config.document_source_name,
        )
        sink = CheckpointSink(
            store=self.ports.checkpoints,
            emitter=self.ports.emitter,
            cancels=self.ports.cancels,
            parent=run.event,
            call=call,
            cancel_event=cancel_event,
            leaks=leaks,
            cancel_local=lambda: self.cancel_local(invocation_id),
            suspended=lambda: self.is_suspended(invocation_id),
            fence=run.fence,
        )

        async def context_for(attempt: int) -> ToolContext:
            # A retry resumes from the latest checkpoint; it does not restart.
            latest = resume if attempt == 1 else await resume_point(self.ports.checkpoints, run)
            return ToolContext(
                invocation_id=invocation_id,
                tenant_id=run.ref.tenant_id,
                agent_did=run.ref.agent_did,
                tool_id=call.tool_id,
                tool_version=call.tool_version,
                attempt=attempt,
                resume_state=latest.state if latest else None,
                checkpoints=sink if call.checkpoint_config.enable_checkpointing else None,
                cancel_event=cancel_event,
                credentials=capability,
                connection_id=call.connection_id,
                documents=documents,
            )

        async def after_transition(transition: Transition, attempt: int) -> None:
            # Acknowledged here: the last attempt's report is settled after the run's acks
            # were awaited (a transition is rare, and the wait for its ack short).
            changed = outcomes.circuit_changed(run, transition, attempt)
            if changed is not None:
                await (await self.ports.emitter.emit(TopicName.EVENTS, changed))

        task = asyncio.current_task()
        assert task is not None
        self.state.running[invocation_id] = _RunningCall(
            task=task, cancel_event=cancel_event, tenant_id=run.ref.tenant_id
        )
        attempts = 0
        try:
            with span(
                tool_span_name(call.tool_id),
                attributes=tool_span_attributes(
                    call.tool_id,
                    call.tool_version,
                    idempotency_key=call.execution_options.idempotency_key,
                ),
            ) as run_span:
                done = await run_attempts(
                    AttemptsInput(
                        spec=spec,
                        parameters=call.parameters,
                        timeout_s=call.timeout_seconds,
                        cancel_event=cancel_event,
                        context_for=context_for,
                        breaker=self.ports.breaker,
                        after_transition=after_transition,
                        runner=runner,
                        circuit_read=admitted.circuit_read,
                    )
                )
                result, attempts = done.result, done.attempts
                if done.reported is not None:  # settled by the caller: it overlaps the rest
                    reports.append(done.reported)
                if result.error is not None:
                    mark_failed(run_span, result.error.code.value)
        except Suspended:
            raise asyncio.CancelledError from None  # handed over at shutdown; resumes there
        except asyncio.CancelledError:
            if not cancel_event.is_set():
                raise  # shutdown or rebalance: the event is redelivered and resumes
            task.uncancel()
            result = RunResult(error=Cancelled("cancelled while running").to_error_info())
        finally:
            # At once, not with the stack: a cancel from now on must not reach this task.
            self.state.running.pop(invocation_id, None)
        if cancel_event.is_set() and result.error is None:
            result = RunResult(error=Cancelled("cancelled while running").to_error_info())
        usage = result.usage
        result, encoded = outcomes.screened(run, result, leaks, spec.tool_id)

        acks += [asyncio.ensure_future(ack) for ack in (invoked_ack, *sink.acks)]
        completed_at = datetime.now(UTC)
        metadata = ExecutionMetadata(
            duration_ms=int((completed_at - started_at).total_seconds() * 1000),
            started_at=started_at,
            completed_at=completed_at,
            attempts=run.prior_runs + attempts,
            checkpoints_created=sink.refs,
            resumed_from_checkpoint_id=resumed_from,
            # Measured for isolated runs; 0 for tools in the executor's loop.
            cpu_used_millicore_seconds=usage.cpu_millicore_seconds if usage else 0,
            memory_peak_mb=usage.memory_peak_mb if usage else 0,
        )
        status = "success" if result.error is None else str(result.error.code)
        metrics.TOOL_EXECUTIONS.labels(call.tool_id, status).inc()
        metrics.TOOL_SECONDS.labels(call.tool_id).observe(metadata.duration_ms / 1000)
        metrics.GENAI_TOOL_SECONDS.labels(
            "execute_tool", call.tool_id, "" if result.error is None else status
        ).observe(metadata.duration_ms / 1000)
        accessed = documents.accessed
        if result.error is not None:
            return [outcomes.failed(run, result.error, metadata, accessed)]
        assert result.result is not None
        try:
            inline, blob = await self.ports.results.pack(
                result.result,
                encoded,
                tenant_id=run.ref.tenant_id,
                invocation_id=invocation_id,
            )
        except ResourceExhausted as exc:
            return [outcomes.failed(run, exc, metadata, accessed)]
        if (
            admitted.cache_id is not None
            and self.ports.cache is not None
            and spec.cache
            and not blob
        ):
            try:
                await self.ports.cache.put(admitted.cache_id, result.result, spec.cache)
            except Exception as exc:  # the cache is an optimisation: never fail a call for it
                log.warning("result not cached: %s", type(exc).__name__)
        checkpoint_ref = sink.refs[-1].checkpoint_id if sink.refs else None
        return [outcomes.executed(run, inline, blob, metadata, checkpoint_ref, accessed)]

    def _stopped(self, run: RunInput, stop: Stop) -> list[Emitted]:
        """The outcome of a call that a gate stopped before its tool started."""
        match stop:
            case Refused(error=error, attempts=attempts):
                metadata = (
                    ExecutionMetadata()
                    if attempts is None
                    else ExecutionMetadata(attempts=attempts)
                )
                return [outcomes.failed(run, error, metadata)]
            case Cached(result=result):
                metrics.TOOL_EXECUTIONS.labels(run.call.tool_id, "cached").inc()
                now = datetime.now(UTC)
                cached = ExecutionMetadata(
                    started_at=now, completed_at=now, attempts=0, cached=True
                )
                return [outcomes.executed(run, result, None, cached, None)]
            case HandedOver():
                raise asyncio.CancelledError  # not started: the next owner runs it

    async def on_cancel(self, event: Envelope) -> None:
        """A cancel request: flag it for every executor, and stop the call if it runs here."""
        request = event.data_as(CancelRequested)
        invocation_id = str(request.invocation_id)
        await self.ports.cancels.request(
            CallKey(tenant_id=request.tenant_id, invocation_id=invocation_id)
        )
        running = self.state.running.get(invocation_id)
        if running is not None and running.tenant_id == request.tenant_id:
            self.cancel_local(invocation_id)
        if self.ports.pool_router is not None:  # a call waiting for its pool ends at the next sweep
            await self.ports.pool_router.queued.due_now(
                CallKey(tenant_id=request.tenant_id, invocation_id=invocation_id)
            )

    def cancel_local(self, invocation_id: str) -> bool:
        running = self.state.running.get(invocation_id)
        if running is None or running.cancel_event.is_set():
            return False
        running.cancel_event.set()
        asyncio.get_running_loop().call_later(self.config.cancel_grace_s, _force_cancel, running)
        return True


def _retrieve_later(
    acknowledged: asyncio.Future[list[object]] | None, acks: list[asyncio.Future[object]]
) -> None:
    """A run that ends without awaiting its acks (an error, a lost lease, a cancel) still
    takes their failures, so none is reported as never retrieved."""
    for future in [acknowledged, *acks]:
        if future is not None:
            future.add_done_callback(_swallow)


def _swallow(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _force_cancel(running: _RunningCall) -> None:
    if not running.task.done():
        running.task.cancel()
