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
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from redis.exceptions import RedisError

from toolfleet.auth.grants import GrantVerifier
from toolfleet.errors import (
    Cancelled,
    CheckpointFailed,
    CircuitBreakerOpen,
    ErrorInfo,
    PermissionDenied,
    RedactionFailed,
    ResourceExhausted,
    ResumeFailed,
    ToolfleetError,
    ToolNotFound,
)
from toolfleet.events.envelope import Envelope, derived_event_id, new_event
from toolfleet.events.large_results import encode_result
from toolfleet.events.models import (
    CancelRequested,
    CheckpointCreated,
    CheckpointRef,
    CircuitChanged,
    ExecutionMetadata,
    InvokeAuthorized,
    InvokeExecuted,
    ResultBlob,
    ToolInvoked,
)
from toolfleet.events.outcomes import failure_event
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.executor.attempts import AttemptsInput, run_attempts
from toolfleet.executor.cache import ResultCache, call_id
from toolfleet.executor.checkpoint_schedule import CheckpointSchedule, CheckpointType
from toolfleet.executor.checkpoints import Checkpoint
from toolfleet.executor.circuits import CircuitBreaker, CircuitStatus, Transition
from toolfleet.executor.concurrency import AgentSlots, agent_key, wait_for_slot
from toolfleet.executor.fencing import Fence
from toolfleet.executor.lease_guard import LeaseGuard, Suspended
from toolfleet.executor.result_transfer import ResultTransfer
from toolfleet.executor.runner import RunResult
from toolfleet.observability import metrics
from toolfleet.observability.tracing import span
from toolfleet.sdk.catalog import ToolCatalog
from toolfleet.sdk.context import CheckpointInput, ToolContext
from toolfleet.sdk.tool import ToolSpec
from toolfleet.secrets.capability import CredentialCapability, LeakDetector, resolve_credentials
from toolfleet.secrets.store import SecretStore

log = logging.getLogger(__name__)

Emitted = tuple[TopicName, Envelope]


class CheckpointStore(Protocol):
    """Hot and durable checkpoints (:class:`~toolfleet.executor.checkpoints.TieredCheckpointStore`).

    ``save`` with a ``fence`` raises :class:`~toolfleet.executor.fencing.StaleLease` when
    the epoch is stale; ``latest`` reads hot, then durable; ``get`` finds a durable one.
    """

    async def save(
        self, checkpoint: Checkpoint, *, fence: Fence | None = None
    ) -> CheckpointType: ...
    async def latest(self, invocation_id: str) -> Checkpoint | None: ...
    async def get(self, checkpoint_id: str) -> Checkpoint | None: ...


class CancelFlags(Protocol):
    async def request(self, invocation_id: str) -> None: ...
    async def is_requested(self, invocation_id: str) -> bool: ...


class Emitter(Protocol):
    """Publishes a lifecycle notification now; the returned awaitable is the broker's ack."""

    async def emit(self, topic: TopicName, envelope: Envelope) -> Awaitable[object]: ...


@dataclass
class _RunningCall:
    task: asyncio.Task[object]
    cancel_event: asyncio.Event


@dataclass(kw_only=True)
class ExecutorService:
    catalog: ToolCatalog
    checkpoints: CheckpointStore
    cancels: CancelFlags
    emitter: Emitter
    worker_id: str
    cancel_grace_s: float = 5.0
    secrets: SecretStore | None = None
    """Where declared credentials are resolved; None refuses every tool that needs one."""
    grants: GrantVerifier | None = None
    """Verifies policy's execution grant before anything runs (defence in depth)."""
    slots: AgentSlots | None = None
    """Bounds the calls one agent runs at once; None leaves them unbounded."""
    breaker: CircuitBreaker | None = None
    """Circuit breakers of the tools' circuits; None lets every call through."""
    cache: ResultCache | None = None
    """Result cache of tools that declare one; None runs every call."""
    results: ResultTransfer = field(default_factory=lambda: ResultTransfer(blobs=None))
    """How results leave: inline, or as a blob when large (no store: large ones fail)."""
    lease_guard: LeaseGuard | None = None
    """Execution leases with fencing epochs; None runs without (one executor, tests)."""
    suspending: bool = False
    suspended_calls: set[str] = field(default_factory=set)
    """Calls whose partition was revoked: like ``suspending``, for those calls only."""
    """Set at shutdown: tools stop at their next checkpoint, the call is handed over."""
    running: dict[str, _RunningCall] = field(default_factory=dict)

    async def on_authorized(self, event: Envelope) -> list[Emitted]:
        call = event.data_as(InvokeAuthorized)
        try:
            self._check_grant(call)
        except ToolfleetError as exc:
            return [self._fail(event, call, exc, ExecutionMetadata())]
        invocation_id = str(call.invocation_id)
        try:
            if self.lease_guard is None:
                return await self._execute(event, call, None)
            return await self._leased(event, call, invocation_id)
        finally:
            self.suspended_calls.discard(invocation_id)

    async def _leased(
        self, event: Envelope, call: InvokeAuthorized, invocation_id: str
    ) -> list[Emitted]:
        assert self.lease_guard is not None
        return await self.lease_guard.run(
            invocation_id,
            lambda fence: self._execute(event, call, fence),
            stopping=lambda: self.is_suspended(invocation_id),
        )

    def suspend(self) -> None:
        """Shutting down: running tools stop at their next checkpoint and are handed over."""
        self.suspending = True

    def suspend_calls(self, invocation_ids: set[str]) -> None:
        """These calls' partitions moved away: hand them over at their next checkpoint."""
        self.suspended_calls |= invocation_ids

    def is_suspended(self, invocation_id: str) -> bool:
        return self.suspending or invocation_id in self.suspended_calls

    async def _execute(
        self, event: Envelope, call: InvokeAuthorized, fence: Fence | None
    ) -> list[Emitted]:
        """Run the call under ``fence`` (the lease epoch; None without leases)."""
        invocation_id = str(call.invocation_id)
        prior_runs = fence.run - 1 if fence is not None else 0
        if await self.cancels.is_requested(invocation_id):
            return [
                self._fail(event, call, Cancelled("cancelled before it ran"), ExecutionMetadata())
            ]
        spec = self.catalog.get(call.tool_id, call.tool_version)
        if spec is None:
            error = ToolNotFound(f"no executor has {call.tool_id}@{call.tool_version} loaded")
            return [self._fail(event, call, error, ExecutionMetadata())]
        cache_id = self._cache_id(spec, call)
        if cache_id is not None and self.cache is not None:
            hit = await self.cache.get(cache_id)
            if hit is not None:
                metrics.TOOL_EXECUTIONS.labels(call.tool_id, "cached").inc()
                now = datetime.now(UTC)
                cached = ExecutionMetadata(
                    started_at=now, completed_at=now, attempts=0, cached=True
                )
                return [self._executed(event, call, hit, None, cached, None)]
        if self.breaker is not None:
            gate = await self.breaker.peek(spec.circuit_name, spec.circuit_breaker)
            if not gate.allowed:
                refused = CircuitBreakerOpen(
                    f"the circuit {spec.circuit_name} is open; calls fail fast until it recovers",
                    details={"circuit": spec.circuit_name},
                    retry_after_s=round(gate.retry_after_s, 3),
                )
                return [self._fail(event, call, refused, ExecutionMetadata(attempts=0))]
        try:
            capability = await self._credentials(spec, call)
        except ToolfleetError as exc:
            return [self._fail(event, call, exc, ExecutionMetadata())]
        leaks = capability.detector() if capability is not None else LeakDetector(())
        slot = agent_key(call.agent_context.tenant_id, call.agent_context.agent_did)
        if self.slots is not None and not await wait_for_slot(
            self.slots,
            slot,
            invocation_id,
            limit=call.max_concurrent_per_agent,
            lease_s=call.timeout_seconds + 30,
            give_up=lambda: self._stop_waiting(invocation_id),
        ):
            if capability is not None:
                capability.revoke()
            if self.is_suspended(invocation_id):
                raise asyncio.CancelledError  # not started: the next owner runs it
            return [
                self._fail(event, call, Cancelled("cancelled before it ran"), ExecutionMetadata())
            ]

        try:
            resume = await self._resume_point(event, call)
        except ResumeFailed as exc:
            if capability is not None:
                capability.revoke()
            if self.slots is not None:
                await self.slots.release(slot, invocation_id)
            return [self._fail(event, call, exc, ExecutionMetadata())]
        started_at = datetime.now(UTC)
        # Not awaited here: the tool starts at once; every ack is awaited before the outcome.
        invoked_ack = await self.emitter.emit(
            TopicName.EVENTS,
            new_event(
                event_type=EventType.INVOKED,
                source=Source.EXECUTOR,
                data=ToolInvoked(
                    invocation_id=call.invocation_id,
                    tenant_id=call.agent_context.tenant_id,
                    agent_did=call.agent_context.agent_did,
                    tool_id=call.tool_id,
                    tool_version=call.tool_version,
                    attempt=prior_runs + 1,
                    worker_id=self.worker_id,
                    started_at=started_at,
                    resumed_from_checkpoint_id=resume.checkpoint_id if resume else None,
                ),
                tenant_id=call.agent_context.tenant_id,
                invocation_id=invocation_id,
                # One per run: a takeover from the same checkpoint is a new start.
                event_id=derived_event_id(
                    event,
                    EventType.INVOKED,
                    f"{prior_runs + 1}:{resume.checkpoint_id if resume else ''}",
                ),
                parent=event,
            ),
        )
        cancel_event = asyncio.Event()
        sink = _CheckpointSink(
            service=self,
            parent=event,
            call=call,
            cancel_event=cancel_event,
            leaks=leaks,
            fence=fence,
        )

        async def context_for(attempt: int) -> ToolContext:
            latest = resume
            if attempt > 1:
                latest = await self._resume_point(event, call)  # resume, not restart
            return ToolContext(
                invocation_id=invocation_id,
                tenant_id=call.agent_context.tenant_id,
                agent_did=call.agent_context.agent_did,
                tool_id=call.tool_id,
                tool_version=call.tool_version,
                attempt=attempt,
                resume_state=latest.state if latest else None,
                checkpoints=sink if call.checkpoint_config.enable_checkpointing else None,
                cancel_event=cancel_event,
                credentials=capability,
                connection_id=call.connection_id,
            )

        async def after_transition(transition: Transition, attempt: int) -> None:
            sink.acks.extend(await self._circuit_changed(event, call, transition, attempt))

        attempts = 0
        task = asyncio.current_task()
        assert task is not None
        self.running[invocation_id] = _RunningCall(task=task, cancel_event=cancel_event)
        try:
            with span(
                f"execute {call.tool_id}",
                attributes={
                    "toolfleet.tool.id": call.tool_id,
                    "toolfleet.tool.version": call.tool_version,
                },
            ):
                done = await run_attempts(
                    AttemptsInput(
                        spec=spec,
                        parameters=call.parameters,
                        timeout_s=call.timeout_seconds,
                        cancel_event=cancel_event,
                        context_for=context_for,
                        breaker=self.breaker,
                        after_transition=after_transition,
                    )
                )
                result, attempts = done.result, done.attempts
        except Suspended:
            raise asyncio.CancelledError from None  # handed over at shutdown; resumes there
        except asyncio.CancelledError:
            if not cancel_event.is_set():
                raise  # shutdown or rebalance: the event is redelivered and resumes
            task.uncancel()
            result = RunResult(error=Cancelled("cancelled while running").to_error_info())
        finally:
            self.running.pop(invocation_id, None)
            if capability is not None:
                capability.revoke()
            if self.slots is not None:
                await self.slots.release(slot, invocation_id)
        if cancel_event.is_set() and result.error is None:
            result = RunResult(error=Cancelled("cancelled while running").to_error_info())
        encoded = encode_result(result.result) if result.result is not None else b""
        if result.result is not None and call.max_result_bytes is not None:
            size = len(encoded)
            if size > call.max_result_bytes:
                result = RunResult(
                    error=ResourceExhausted(
                        f"the result is {size} bytes, over the budget of "
                        f"{call.max_result_bytes} bytes",
                        details={"bytes": size, "budget": call.max_result_bytes},
                    ).to_error_info()
                )
        if leaks and leaks.leaks([result.result, result.error]):
            log.warning(
                "tool output carried a credential; withheld", extra={"tool_id": spec.tool_id}
            )
            result = RunResult(
                error=RedactionFailed(
                    f"{spec.tool_id} put a credential in its output; the output was withheld"
                ).to_error_info()
            )

        await asyncio.gather(invoked_ack, *sink.acks)
        completed_at = datetime.now(UTC)
        metadata = ExecutionMetadata(
            duration_ms=int((completed_at - started_at).total_seconds() * 1000),
            started_at=started_at,
            completed_at=completed_at,
            attempts=prior_runs + attempts,
            checkpoints_created=sink.refs,
            resumed_from_checkpoint_id=resume.checkpoint_id if resume else None,
        )
        status = "success" if result.error is None else str(result.error.code)
        metrics.TOOL_EXECUTIONS.labels(call.tool_id, status).inc()
        metrics.TOOL_SECONDS.labels(call.tool_id).observe(metadata.duration_ms / 1000)
        if result.error is not None:
            return [self._fail(event, call, result.error, metadata)]
        assert result.result is not None
        try:
            inline, blob = await self.results.pack(
                result.result,
                encoded,
                tenant_id=call.agent_context.tenant_id,
                invocation_id=invocation_id,
            )
        except ResourceExhausted as exc:
            return [self._fail(event, call, exc, metadata)]
        if cache_id is not None and self.cache is not None and spec.cache is not None and not blob:
            try:
                await self.cache.put(cache_id, result.result, spec.cache)
            except Exception as exc:  # the cache is an optimisation: never fail a call for it
                log.warning("result not cached: %s", type(exc).__name__)
        checkpoint_ref = sink.refs[-1].checkpoint_id if sink.refs else None
        return [self._executed(event, call, inline, blob, metadata, checkpoint_ref)]

    def _cache_id(self, spec: ToolSpec, call: InvokeAuthorized) -> str | None:
        """The call's cache key, or None when its tool is not cacheable."""
        if spec.cache is None or spec.credentials:
            return None
        return call_id(
            tool_id=call.tool_id,
            tool_version=call.tool_version,
            parameters=call.parameters,
            tenant_id=call.agent_context.tenant_id,
        )

    def _executed(
        self,
        event: Envelope,
        call: InvokeAuthorized,
        result: dict[str, Any],
        blob: ResultBlob | None,
        metadata: ExecutionMetadata,
        checkpoint_ref: str | None,
    ) -> Emitted:
        executed = InvokeExecuted(
            invocation_id=call.invocation_id,
            tool_id=call.tool_id,
            tool_version=call.tool_version,
            agent_context=call.agent_context,
            result=result,
            result_blob=blob,
            warnings=call.warnings,
            execution_metadata=metadata,
            checkpoint_ref=checkpoint_ref,
        )
        return (
            TopicName.EXECUTED,
            new_event(
                event_type=EventType.INVOKE_EXECUTED,
                source=Source.EXECUTOR,
                data=executed,
                tenant_id=call.agent_context.tenant_id,
                invocation_id=str(call.invocation_id),
                event_id=derived_event_id(event, EventType.INVOKE_EXECUTED),
                parent=event,
            ),
        )

    async def _circuit_changed(
        self, event: Envelope, call: InvokeAuthorized, transition: Transition, attempt: int
    ) -> list[Awaitable[object]]:
        """``ai.agent.circuit.opened|closed`` for a transition this call caused."""
        if transition.status is CircuitStatus.HALF_OPEN:
            return []  # published on circuit:state:changes only; not a contract event
        event_type = (
            EventType.CIRCUIT_OPENED
            if transition.status is CircuitStatus.OPEN
            else EventType.CIRCUIT_CLOSED
        )
        ack = await self.emitter.emit(
            TopicName.EVENTS,
            new_event(
                event_type=event_type,
                source=Source.EXECUTOR,
                data=CircuitChanged(
                    circuit_name=transition.circuit_name,
                    state=transition.status.value,
                    reason=transition.reason,
                    retry_after_s=transition.retry_after_s,
                    at=datetime.now(UTC),
                ),
                tenant_id=call.agent_context.tenant_id,
                invocation_id=str(call.invocation_id),
                event_id=derived_event_id(
                    event, event_type, f"{transition.circuit_name}:{attempt}"
                ),
                parent=event,
            ),
        )
        return [ack]

    async def _resume_point(self, event: Envelope, call: InvokeAuthorized) -> Checkpoint | None:
        """The checkpoint a run of ``call`` starts from (None: from scratch).

        The latest one (hot, else durable), unless the request names one in
        ``resume_from_checkpoint_id``: then that one, as long as this request's own runs
        have not checkpointed since it was authorized (a takeover carries on from there).

        Raises:
            ResumeFailed: the named checkpoint is not one of this invocation's.
        """
        config = call.checkpoint_config
        if not config.enable_checkpointing:
            return None
        invocation_id = str(call.invocation_id)
        tenant_id = call.agent_context.tenant_id
        latest = await self.checkpoints.latest(invocation_id)
        if latest is not None and not _belongs(latest, invocation_id, tenant_id):
            latest = None
        wanted = config.resume_from_checkpoint_id
        if wanted is None:
            return latest
        authorized_at = event.time or call.requested_at
        if latest is not None and (
            latest.checkpoint_id == wanted or latest.timestamp > authorized_at
        ):
            return latest
        named = await self.checkpoints.get(wanted)
        if named is None or not _belongs(named, invocation_id, tenant_id):
            # One answer for unknown and foreign ids: nothing about others' checkpoints leaks.
            raise ResumeFailed(
                "resume_from_checkpoint_id names no durable checkpoint of this invocation",
                details={"checkpoint_id": wanted},
            )
        return named

    def _check_grant(self, call: InvokeAuthorized) -> None:
        """Run only what policy granted: a forged or altered authorized event runs nothing."""
        if self.grants is None:
            return
        if not call.grant:
            raise PermissionDenied("the call carries no execution grant from policy")
        self.grants.verify(
            call.grant,
            invocation_id=str(call.invocation_id),
            tenant_id=call.agent_context.tenant_id,
            agent_did=call.agent_context.agent_did,
            tool_id=call.tool_id,
            tool_version=call.tool_version,
            parameters=call.parameters,
        )

    async def _stop_waiting(self, invocation_id: str) -> bool:
        return self.is_suspended(invocation_id) or await self.cancels.is_requested(invocation_id)

    async def on_cancel(self, event: Envelope) -> None:
        """A cancel request: flag it for every executor, and stop the call if it runs here."""
        request = event.data_as(CancelRequested)
        invocation_id = str(request.invocation_id)
        await self.cancels.request(invocation_id)
        self.cancel_local(invocation_id)

    async def _credentials(
        self, spec: ToolSpec, call: InvokeAuthorized
    ) -> CredentialCapability | None:
        """Resolve the tool's declared credentials for this call, now (execution time)."""
        if not spec.credentials:
            return None
        if not call.connection_id:
            raise PermissionDenied(
                f"tool needs a connection: {spec.tool_id} uses credentials "
                f"{list(spec.credentials)}; pass connection_id"
            )
        if self.secrets is None:
            raise PermissionDenied("no secret store is configured on this executor")
        return await resolve_credentials(
            self.secrets,
            tenant_id=call.agent_context.tenant_id,
            connection_id=call.connection_id,
            names=spec.credentials,
            tool_id=spec.tool_id,
        )

    def cancel_local(self, invocation_id: str) -> bool:
        running = self.running.get(invocation_id)
        if running is None or running.cancel_event.is_set():
            return False
        running.cancel_event.set()
        asyncio.get_running_loop().call_later(self.cancel_grace_s, _force_cancel, running)
        return True

    def _fail(
        self,
        event: Envelope,
        call: InvokeAuthorized,
        error: ToolfleetError | ErrorInfo,
        metadata: ExecutionMetadata,
    ) -> Emitted:
        return (
            TopicName.RESULTS,
            failure_event(
                event,
                Source.EXECUTOR,
                error,
                invocation_id=str(call.invocation_id),
                tenant_id=call.agent_context.tenant_id,
                agent_did=call.agent_context.agent_did,
                tool_id=call.tool_id,
                tool_version=call.tool_version,
                warnings=call.warnings,
                execution_metadata=metadata,
            ),
        )


def _belongs(checkpoint: Checkpoint, invocation_id: str, tenant_id: str) -> bool:
    """A checkpoint is only ever handed to its own invocation of its own tenant."""
    return checkpoint.invocation_id == invocation_id and checkpoint.tenant_id in (
        None,  # a hot copy written before checkpoints carried their tenant
        tenant_id,
    )


def _force_cancel(running: _RunningCall) -> None:
    if not running.task.done():
        running.task.cancel()


@dataclass(kw_only=True)
class _CheckpointSink:
    """``ToolContext.checkpoint`` lands here: the stores first, then the event.

    Each checkpoint is ``micro`` (hot only), ``macro`` or ``named`` (durable too), as
    :class:`~toolfleet.executor.checkpoint_schedule.CheckpointSchedule` decides. A write
    refused for a stale ``fence`` raises :class:`~toolfleet.executor.fencing.StaleLease`
    out of ``ctx.checkpoint()``.
    """

    service: ExecutorService
    parent: Envelope
    call: InvokeAuthorized
    cancel_event: asyncio.Event
    leaks: LeakDetector
    fence: Fence | None = None
    """The lease epoch every checkpoint write is fenced with (None: unfenced)."""
    refs: list[CheckpointRef] = field(default_factory=list)
    acks: list[Awaitable[object]] = field(default_factory=list)
    schedule: CheckpointSchedule = field(init=False)

    def __post_init__(self) -> None:
        self.schedule = CheckpointSchedule(
            interval_s=self.call.checkpoint_config.checkpoint_interval_seconds
        )

    async def _cancel_flagged(self, invocation_id: str) -> bool:
        try:
            return await self.service.cancels.is_requested(invocation_id)
        except RedisError as exc:  # the control topic still delivers the cancel
            log.warning("cancel flag unreadable: %s", type(exc).__name__)
            return False

    async def save(self, checkpoint: CheckpointInput) -> str:
        invocation_id = str(self.call.invocation_id)
        if self.leaks and self.leaks.leaks([checkpoint.state, checkpoint.current_phase]):
            raise RedactionFailed(
                f"{self.call.tool_id} put a credential in a checkpoint; it was not saved"
            )
        checkpoint_id = uuid.uuid4().hex
        now = datetime.now(UTC)
        kind = self.schedule.kind_of(checkpoint.name)
        try:
            kind = await self.service.checkpoints.save(
                Checkpoint(
                    checkpoint_id=checkpoint_id,
                    invocation_id=invocation_id,
                    tenant_id=self.call.agent_context.tenant_id,
                    checkpoint_type=kind,
                    name=checkpoint.name,
                    state=checkpoint.state,
                    progress_percent=checkpoint.progress_percent,
                    current_phase=checkpoint.current_phase,
                    timestamp=now,
                ),
                fence=self.fence,
            )
        except (ConnectionError, OSError) as exc:
            raise CheckpointFailed(f"checkpoint could not be saved: {type(exc).__name__}") from None
        self.schedule.record(kind)
        ack = await self.service.emitter.emit(
            TopicName.EVENTS,
            new_event(
                event_type=EventType.CHECKPOINT_CREATED,
                source=Source.EXECUTOR,
                data=CheckpointCreated(
                    invocation_id=self.call.invocation_id,
                    tenant_id=self.call.agent_context.tenant_id,
                    tool_id=self.call.tool_id,
                    checkpoint_id=checkpoint_id,
                    checkpoint_type=kind,
                    progress_percent=checkpoint.progress_percent,
                    current_phase=checkpoint.current_phase,
                    timestamp=now,
                ),
                tenant_id=self.call.agent_context.tenant_id,
                invocation_id=invocation_id,
                event_id=derived_event_id(self.parent, EventType.CHECKPOINT_CREATED, checkpoint_id),
                parent=self.parent,
            ),
        )
        self.acks.append(ack)
        self.refs.append(
            CheckpointRef(checkpoint_id=checkpoint_id, checkpoint_type=kind, timestamp=now)
        )
        # A cancel whose control event this worker missed is still seen here.
        if not self.cancel_event.is_set() and await self._cancel_flagged(invocation_id):
            self.service.cancel_local(invocation_id)
        if self.service.is_suspended(invocation_id):
            await ack
            raise Suspended  # saved: the next owner of the call carries on from here
        return checkpoint_id
