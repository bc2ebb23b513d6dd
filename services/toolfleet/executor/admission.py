"""The run gates: an ``invoke.authorized`` call passes before its tool starts.

In order: **grant** (policy signed this very call, and the capability token behind it
is not revoked; checked before the lease), the **lease**
(:meth:`~toolfleet.executor.leasing.guard.LeaseGuard.hold`, entered by the service),
then **cancel** (a cancel flag is up), **tool** (this executor has the tool version
loaded), **cache** (a cached result answers the call), **circuit** (the tool's circuit
is open), **credentials** (resolved now, at execution time), **slot** (the agent's
concurrency bound; waits, never fails) and **resume** (the checkpoint a run
starts from). Each gate reads one frozen :class:`RunInput`, may add what it found to
:class:`GatesPassed`, and either lets the call go on (``None``) or ends it with a typed
:data:`Stop`. Whatever a gate acquires it hands to the run's ``AsyncExitStack`` at once
(credentials revoked, slot released), so no exit path can skip a release.

The resume gate's read goes out early: once the tool and the cache have let a call
through, its checkpoint is read while the circuit, the credentials and the agent's slot
decide, not one round trip after them (:meth:`RunGates.admit`). The gates still decide
in their order; a call stopped before the resume gate drops the read. Likewise the
slot's release, started as the stack unwinds, overlaps the lease's finish
(:class:`Releases`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from toolfleet.auth.grants import ExecutionGrant, GrantVerifier
from toolfleet.errors import (
    Cancelled,
    CircuitBreakerOpen,
    PermissionDenied,
    ResumeFailed,
    ToolfleetError,
    ToolNotFound,
)
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import CallRef
from toolfleet.events.models import InvokeAuthorized
from toolfleet.executor.cache import ResultCache, call_id
from toolfleet.executor.checkpoints.store import (
    Checkpoint,
    CheckpointStore,
    TieredCheckpointStore,
)
from toolfleet.executor.circuits.breaker import CircuitBreaker
from toolfleet.executor.concurrency import AgentSlots, agent_key, wait_for_slot
from toolfleet.executor.leasing.fencing import Fence
from toolfleet.executor.leasing.leases import Seen
from toolfleet.executor.ports import ToolProvider
from toolfleet.registry.catalog import ToolCatalog
from toolfleet.secrets.capability import CredentialCapability, resolve_credentials
from toolfleet.secrets.store import SecretStore
from toolfleet.storage.cancel_flags import CancelFlags
from toolfleet.storage.revocation import RevocationList, ensure_grant_not_revoked
from toolfleet.tools.spec import ToolSpec

__all__ = [
    "Cached",
    "GatesPassed",
    "HandedOver",
    "Refused",
    "Releases",
    "RunGates",
    "RunInput",
    "Stop",
    "check_grant",
    "resume_point",
]


@dataclass(frozen=True, kw_only=True)
class RunInput:
    """One run of one call: what every gate and the run itself read."""

    event: Envelope
    """The ``invoke.authorized`` event (the parent of everything the run emits)."""
    call: InvokeAuthorized
    fence: Fence | None = None
    """The lease epoch the run writes under (None: run without leases)."""
    grant: ExecutionGrant | None = None
    """Policy's grant of this call, verified by :func:`check_grant` (None: no verifier)."""
    seen: Seen | None = None
    """The cancel flag and hot checkpoint as the lease's script read them (None: the
    gates read the cancel flags and checkpoints themselves)."""

    @cached_property
    def invocation_id(self) -> str:
        return str(self.call.invocation_id)

    @cached_property
    def ref(self) -> CallRef:
        """The call's identity and trace, built once per run."""
        return CallRef.of(self.call, trace=self.event.traceparent)

    @property
    def prior_runs(self) -> int:
        """Runs of this invocation before this one (takeovers after a worker died)."""
        return self.fence.run - 1 if self.fence is not None else 0


@dataclass(frozen=True, kw_only=True)
class Refused:
    """The call fails before its tool starts."""

    error: ToolfleetError
    attempts: int | None = None
    """``execution_metadata.attempts`` to report (None: the default)."""


@dataclass(frozen=True, kw_only=True)
class Cached:
    """A cached result of the same call answers it; the tool does not run."""

    result: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class HandedOver:
    """Not started, and the call is being handed over: the next owner runs it."""


Stop = Refused | Cached | HandedOver
"""What ends a call at a gate."""


@dataclass(kw_only=True)
class GatesPassed:
    """What the gates found, for the run: filled in as they pass."""

    spec: ToolSpec | None = None
    cache_id: str | None = None
    """The call's result-cache key (None: not cacheable, or no cache)."""
    capability: CredentialCapability | None = None
    resume: Checkpoint | None = None
    circuit_read: str | None = None
    """The tool's circuit state as the circuit gate read it (the first attempt's check
    takes it instead of reading it again)."""
    resume_read: asyncio.Task[Checkpoint | None] | None = None
    """The resume gate's read, started before the circuit gate (None: the call does not
    checkpoint)."""
    releases: Releases
    """Where the slot gate starts the slot's release (the run's stack awaits it)."""

    @property
    def tool(self) -> ToolSpec:
        assert self.spec is not None, "the tool gate runs first"
        return self.spec


Gate = Callable[[RunInput, GatesPassed, AsyncExitStack], Awaitable[Stop | None]]


class Releases:
    """Releases a run's stack starts as it unwinds, awaited together at its bottom.

    The agent's slot is released as the call's stack unwinds, and the lease's finish
    follows it (the lease is entered first, so it unwinds last): at one call in flight
    two round trips, one after the other, before the outcome leaves. A release started
    here runs while the rest of the stack unwinds, the lease's finish included, and
    :meth:`wait`, pushed onto the stack before the lease, awaits it: the outcome still
    leaves only once the slot is back, and a release that fails fails the delivery as
    before, now after the lease recorded the outcome (the next delivery replays it).
    """

    def __init__(self) -> None:
        self._started: list[asyncio.Future[object]] = []

    def start(self, release: Callable[[], Awaitable[object]]) -> None:
        """Start ``release`` now (an awaitable already under way is taken as it is)."""
        self._started.append(asyncio.ensure_future(release()))

    async def wait(self) -> None:
        """Every release started, done; raises the first one's error."""
        started, self._started = self._started, []
        if len(started) == 1:  # the slot's: gathering one future was 1.3% of a call at 200
            await started[0]
            return
        for failed in await asyncio.gather(*started, return_exceptions=True):
            if isinstance(failed, BaseException):
                raise failed


async def check_grant(
    grants: GrantVerifier | None,
    revocations: RevocationList | None,
    run: RunInput,
    *,
    granted: Callable[[ExecutionGrant], None] | None = None,
) -> Stop | None:
    """Run only what policy granted: a forged or altered authorized event runs nothing,
    nor a grant whose capability token was revoked since policy authorized the call.

    ``grants`` is None only for an executor built in process over twins (unit tests);
    the worker always has one: it refuses to start without the grant key
    (:func:`toolfleet.worker.require_keys`).

    Raises:
        RedisError: the revocation list is unreachable (retried; never run unchecked).
    """
    if grants is None:
        return None
    call = run.call
    if not call.grant:
        return Refused(error=PermissionDenied("the call carries no execution grant from policy"))
    try:
        grant = grants.decode(
            call.grant,
            call=run.ref,
            parameters=call.parameters,
            document_context=(
                None
                if call.document_context is None
                else call.document_context.model_dump(mode="json")
            ),
            pool=call.pool,
        )
        if revocations is not None:
            await ensure_grant_not_revoked(revocations, grant)
    except ToolfleetError as exc:
        return Refused(error=exc)
    if granted is not None:
        granted(grant)
    return None


@dataclass(frozen=True, kw_only=True)
class RunGates:
    """The gates after the lease, over the executor's ports (None: that gate is off)."""

    catalog: ToolCatalog
    cancels: CancelFlags
    checkpoints: CheckpointStore
    is_suspended: Callable[[str], bool]
    secrets: SecretStore | None = None
    slots: AgentSlots | None = None
    breaker: CircuitBreaker | None = None
    cache: ResultCache | None = None
    providers: tuple[ToolProvider, ...] = ()
    """Asked in order for a tool the catalog does not hold (tool sources)."""

    async def admit(
        self, run: RunInput, stack: AsyncExitStack, releases: Releases
    ) -> GatesPassed | Stop:
        """Pass every gate in order; the first :data:`Stop` ends the call. ``releases``:
        where the slot's release starts as ``stack`` unwinds (``stack`` awaits it).

        At one call in flight the gates were round trips one after the other: the
        circuit peek, the agent's slot, then the checkpoint (a Postgres read whenever
        Redis holds no hot copy, so on nearly every call). The checkpoint does not depend
        on what the gates before it decide, and nothing else writes this call's
        checkpoints while this executor holds its lease, so it is read as the circuit
        gate starts, and its round trip overlaps theirs (``bench/PROFILE.md``,
        twenty-third pass).
        """
        admitted = GatesPassed(releases=releases)
        for gate in (self.cancel, self.tool, self.cached):
            stop = await gate(run, admitted, stack)
            if stop is not None:
                return stop
        if run.call.checkpoint_config.enable_checkpointing:
            admitted.resume_read = asyncio.ensure_future(
                resume_point(self.checkpoints, run, seen=run.seen)
            )
        try:
            for gate in (self.circuit, self.credentials, self.slot, self.resume):
                stop = await gate(run, admitted, stack)
                if stop is not None:
                    return stop
        finally:
            if admitted.resume_read is not None:
                # Taken by its gate, this does nothing. A call stopped before the resume
                # gate drops the read: cancelled if under way; if it already ended with
                # an error, asyncio reports no error of a future cancel() was called on.
                admitted.resume_read.cancel()
        return admitted

    async def cancel(
        self, run: RunInput, admitted: GatesPassed, stack: AsyncExitStack
    ) -> Stop | None:
        if run.seen is not None:
            requested = run.seen.cancel_requested
        else:
            requested = await self.cancels.is_requested(run.ref.key)
        if requested:
            return Refused(error=Cancelled("cancelled before it ran"))
        return None

    async def find_tool(self, call: InvokeAuthorized) -> ToolSpec | None:
        """The call's tool version as this executor has it: loaded, or from a source."""
        spec = self.catalog.get(call.tool_id, call.tool_version)
        for provider in self.providers:
            if spec is not None:
                break
            spec = await provider.spec(call.tool_id, call.tool_version)
        return spec

    async def tool(
        self, run: RunInput, admitted: GatesPassed, stack: AsyncExitStack
    ) -> Stop | None:
        call = run.call
        admitted.spec = await self.find_tool(call)
        if admitted.spec is None:
            error = ToolNotFound(f"no executor has {call.tool_id}@{call.tool_version} loaded")
            return Refused(error=error)
        return None

    async def cached(
        self, run: RunInput, admitted: GatesPassed, stack: AsyncExitStack
    ) -> Stop | None:
        spec, call = admitted.tool, run.call
        if self.cache is None or spec.cache is None or spec.credentials:
            return None
        if call.document_context is not None:
            return None  # its result depends on documents, which the cache key does not name
        admitted.cache_id = call_id(
            tool_id=call.tool_id,
            tool_version=call.tool_version,
            parameters=call.parameters,
            tenant_id=run.ref.tenant_id,
        )
        hit = await self.cache.get(admitted.cache_id)
        return None if hit is None else Cached(result=hit)

    async def circuit(
        self, run: RunInput, admitted: GatesPassed, stack: AsyncExitStack
    ) -> Stop | None:
        spec = admitted.tool
        if self.breaker is None:
            return None
        gate = await self.breaker.peek(spec.circuit_name, spec.circuit_breaker)
        if gate.allowed:
            admitted.circuit_read = gate.read
            return None
        refused = CircuitBreakerOpen(
            f"the circuit {spec.circuit_name} is open; calls fail fast until it recovers",
            details={"circuit": spec.circuit_name},
            retry_after_s=round(gate.retry_after_s, 3),
        )
        return Refused(error=refused, attempts=0)

    async def credentials(
        self, run: RunInput, admitted: GatesPassed, stack: AsyncExitStack
    ) -> Stop | None:
        """Resolve the tool's declared credentials for this call, now (execution time)."""
        spec, call = admitted.tool, run.call
        if not spec.credentials:
            return None
        if not call.connection_id:
            return Refused(
                error=PermissionDenied(
                    f"tool needs a connection: {spec.tool_id} uses credentials "
                    f"{list(spec.credentials)}; pass connection_id"
                )
            )
        if self.secrets is None:
            return Refused(error=PermissionDenied("no secret store is configured on this executor"))
        try:
            capability = await resolve_credentials(
                self.secrets,
                tenant_id=run.ref.tenant_id,
                connection_id=call.connection_id,
                names=spec.credentials,
                tool_id=spec.tool_id,
            )
        except ToolfleetError as exc:
            return Refused(error=exc)
        stack.callback(capability.revoke)  # on every exit: outcome, error, cancel
        admitted.capability = capability
        return None

    async def slot(
        self, run: RunInput, admitted: GatesPassed, stack: AsyncExitStack
    ) -> Stop | None:
        """Wait for one of the agent's slots (a cancel or a hand-over stops the wait)."""
        if self.slots is None:
            return None
        call, holder = run.call, run.invocation_id
        key = agent_key(run.ref.tenant_id, run.ref.agent_did)

        async def give_up() -> bool:
            return self.is_suspended(holder) or await self.cancels.is_requested(run.ref.key)

        taken = await wait_for_slot(
            self.slots,
            key,
            holder,
            limit=call.max_concurrent_per_agent,
            lease_s=call.timeout_seconds + 30,
            give_up=give_up,
        )
        if not taken:
            if self.is_suspended(holder):
                return HandedOver()
            return Refused(error=Cancelled("cancelled before it ran"))
        stack.callback(admitted.releases.start, functools.partial(self.slots.release, key, holder))
        return None

    async def resume(
        self, run: RunInput, admitted: GatesPassed, stack: AsyncExitStack
    ) -> Stop | None:
        if admitted.resume_read is None:
            return None  # the call does not checkpoint: nothing to resume from
        try:
            admitted.resume = await admitted.resume_read
        except ResumeFailed as exc:
            return Refused(error=exc)
        return None


async def resume_point(
    checkpoints: CheckpointStore, run: RunInput, *, seen: Seen | None = None
) -> Checkpoint | None:
    """The checkpoint a run of the call starts from (None: from scratch).

    The latest one (hot, else durable), unless the request names one in
    ``resume_from_checkpoint_id``: then that one, as long as this request's own runs
    have not checkpointed since it was authorized (a takeover carries on from there).
    With ``seen`` (read with the lease, before the run wrote anything) the hot
    checkpoint is not read again from a tiered store.

    Raises:
        ResumeFailed: the named checkpoint is not one of this invocation's.
    """
    call = run.call
    config = call.checkpoint_config
    if not config.enable_checkpointing:
        return None
    invocation_id, tenant_id = run.invocation_id, run.ref.tenant_id
    if seen is not None and isinstance(checkpoints, TieredCheckpointStore):
        latest = await checkpoints.latest_after(run.ref.key, hot=seen.hot_checkpoint)
    else:
        latest = await checkpoints.latest(run.ref.key)
    if latest is not None and not _belongs(latest, invocation_id, tenant_id):
        latest = None
    wanted = config.resume_from_checkpoint_id
    if wanted is None:
        return latest
    authorized_at = run.event.time or call.requested_at
    if latest is not None and (latest.checkpoint_id == wanted or latest.timestamp > authorized_at):
        return latest
    named = await checkpoints.get(wanted)
    if named is None or not _belongs(named, invocation_id, tenant_id):
        # One answer for unknown and foreign ids: nothing about others' checkpoints leaks.
        raise ResumeFailed(
            "resume_from_checkpoint_id names no durable checkpoint of this invocation",
            details={"checkpoint_id": wanted},
        )
    return named


def _belongs(checkpoint: Checkpoint, invocation_id: str, tenant_id: str) -> bool:
    """A checkpoint is only ever handed to its own invocation of its own tenant."""
    return checkpoint.invocation_id == invocation_id and checkpoint.tenant_id in (
        None,  # a hot copy written before checkpoints carried their tenant
        tenant_id,
    )
