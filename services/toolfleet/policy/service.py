"""Policy's decisions over ports: no Kafka, Redis or Postgres imports here.

For each ``invoke.requested``, in order: the event is well-formed, the tenant is the
same in the key, the ``tenantid`` attribute and the body; the capability token is
valid and names this tenant, agent and tool; the tool and version resolve in the
registry; policy-as-data allows it; the parameters match the input schema. Then the
call is either authorized or parked for a human approval. Every refusal is a typed
terminal outcome, never an exception escaping the consumer.

An authorized call names its tool's executor pool (the manifest's ``pool``, never the
request's: requests have no such field); the handler publishes it on that pool's topic.
When no executor of the pool is live (:class:`~toolfleet.policy.pools.PoolLiveness`)
the call is also announced ``queued`` and indexed under its deadline
(:mod:`toolfleet.storage.pools`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from toolfleet.auth.control import ControlVerifier, control_claims
from toolfleet.auth.grants import GrantSigner
from toolfleet.auth.grants import parameters_hash as _grant_parameters_hash
from toolfleet.auth.outcomes import OutcomeVerifier, screen
from toolfleet.auth.tokens import Capability, TokenVerifier
from toolfleet.contract.manifest import SourceType
from toolfleet.errors import (
    ErrorCode,
    InvalidEvent,
    InvocationIdConflict,
    PermissionDenied,
    ToolfleetError,
)
from toolfleet.events.envelope import Emitted, Envelope, derived_event_id, new_event
from toolfleet.events.identity import (
    CallKey,
    CallRef,
    canonical_uuid,
    check_key_tenant,
    invocation_uuid,
)
from toolfleet.events.models import (
    ApprovalDecision,
    ApprovalRequested,
    CancelRequested,
    ControlRefused,
    InvokeAuthorized,
    InvokeRequested,
    OutcomeRefusalKind,
    ToolOutcome,
)
from toolfleet.events.outcomes import failure_event, outcome_event, refused_outcome_event
from toolfleet.events.types import TERMINAL_TYPES, EventType, Source, TopicName
from toolfleet.observability.metrics import OUTCOMES_REFUSED
from toolfleet.policy.admission import Admission, AdmitInput
from toolfleet.policy.claims import (
    DEFAULT_CLAIM_TTL_S,
    CallIdentity,
    ClaimVerdict,
    InvocationClaims,
    MemoryInvocationClaims,
)
from toolfleet.policy.documents import TenantPolicy
from toolfleet.policy.engine import DecisionCache, PolicyDecision, PolicyQuery
from toolfleet.policy.idempotency import (
    Claim,
    ClaimKind,
    IdempotencyStore,
    conflict_error,
    outcome_for_duplicate,
)
from toolfleet.policy.limits import check_resource_limits
from toolfleet.policy.pools import PoolLiveness
from toolfleet.policy.ratelimit import RateLimiter, RateLimits, rate_limit_error
from toolfleet.registry.enforcement import check_parameters
from toolfleet.registry.lookup import ResolvedTool, ToolLookup
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.registry.versions import matches
from toolfleet.storage.cancel_flags import CancelFlags
from toolfleet.storage.pools import QueuedCalls, queued_call, queued_notification
from toolfleet.storage.revocation import RevocationList, ensure_not_revoked
from toolfleet.tools.limits import FleetLimits

AUTHTYPE = "app_user"
"""authcontext ``authtype`` for calls authorized by a verified capability token."""


class PendingApproval(BaseModel):
    """An authorized call parked until a human decides."""

    model_config = ConfigDict(frozen=True)

    authorized: InvokeAuthorized
    parameters_hash: str
    expires_at: datetime
    tenant_id: str
    traceparent: str | None
    authid: str
    capability_jti: str = ""
    """``jti`` of the verified capability token, bound into the execution grant."""
    filesystem_permissions: tuple[str, ...] = ()
    """The token's ``filesystem_permissions``, signed into the grant once approved."""
    network_permissions: tuple[str, ...] = ()
    """The token's ``network_permissions``, signed into the grant once approved."""


class TenantPolicies(Protocol):
    """A tenant's policy, cached (:class:`toolfleet.policy.provider.PolicyProvider`)."""

    async def policy_for(self, tenant_id: str) -> TenantPolicy | None: ...


class ApprovalStore(Protocol):
    """Parked approvals, by call: a call is its tenant and its invocation id."""

    async def put(self, call: CallKey, pending: PendingApproval, ttl_s: int) -> None: ...
    async def peek(self, call: CallKey) -> PendingApproval | None: ...
    async def take(self, call: CallKey) -> PendingApproval | None: ...


class _Waiter(BaseModel):
    """What resolving a duplicate later needs of its request (stored beside the key)."""

    agent_did: str
    source: str
    event_id: str
    traceparent: str | None = None


def parameters_hash(tool_id: str, version: str, parameters: dict[str, Any]) -> str:
    """SHA-256 of the canonical tool, version and parameters (approvals, idempotency, grants)."""
    return _grant_parameters_hash(tool_id, version, parameters)


@dataclass(kw_only=True)
class PolicyService:
    lookup: ToolLookup
    verifier: TokenVerifier | None
    policies: TenantPolicies
    schemas: CompiledSchemas
    approvals: ApprovalStore
    cancels: CancelFlags
    limiter: RateLimiter
    idempotency: IdempotencyStore
    revocations: RevocationList | None = None
    grants: GrantSigner | None = None
    control: ControlVerifier | None = None
    """Checks the signature of approvals, denials and cancels; ``None`` refuses them all."""
    admission: Admission | None = None
    """Rate limit and idempotency claim in one step; ``None``: ``limiter`` then
    ``idempotency``."""
    approval_ttl_s: int = 24 * 3600
    idempotency_ttl_s: int = 7 * 24 * 3600
    decisions: DecisionCache = field(default_factory=DecisionCache)
    """Policy decisions per policy object (a changed policy is a new object)."""
    fleet_limits: FleetLimits = field(default_factory=FleetLimits)
    """The fleet's limits a request may only lower (``TOOLFLEET_ISOLATION_MEMORY_MB``...)."""
    claims: InvocationClaims = field(default_factory=MemoryInvocationClaims)
    """Which call each invocation id names (:mod:`toolfleet.policy.claims`)."""
    claim_ttl_s: int = DEFAULT_CLAIM_TTL_S
    outcomes: OutcomeVerifier | None = None
    """Checks the signature of outcomes duplicates wait on; ``None`` refuses them all."""
    pools: PoolLiveness | None = None
    """Which executor pools have a live executor; ``None``: every pool counts as served."""
    queued: QueuedCalls | None = None
    """Where a call of a pool without a live executor waits for its deadline."""

    # --- invoke.requested ----------------------------------------------------------

    async def on_requested(self, event: Envelope, key: bytes | None) -> list[Emitted]:
        # Nothing a producer claims about auth is trusted: policy sets it after verifying.
        if event.authtype is not None or event.authid is not None:
            event = event.model_copy(update={"authtype": None, "authid": None})
        if not (_key_text(key) or event.tenantid):  # as _identity_of, before anything else
            raise InvalidEvent("invoke event has neither a key nor a tenantid attribute")
        # A record keyed by another tenant is nobody's to answer: the DLQ, with why.
        check_key_tenant(event, key)
        try:
            request = event.data_as(InvokeRequested)
            invocation_id = _check_identity(event, key, request)
            capability = await self._verify(request)
            tenant = request.agent_context.tenant_id
            tenant_policy = await self.policies.policy_for(tenant)
            resolved = await self.lookup.resolve(
                request.tool_id,
                request.tool_version,
                pinned=self.decisions.pinned(tenant_policy, request.tool_id),
            )
            manifest = resolved.manifest
            if capability.tool_version not in {"", "*"} and not matches(
                capability.tool_version, manifest.version
            ):
                raise PermissionDenied(
                    f"capability token does not grant {manifest.tool_id}@{manifest.version}"
                )
            decision = self.decisions.decide(
                tenant_policy,
                PolicyQuery(
                    tenant_id=tenant,
                    agent_did=request.agent_context.agent_did,
                    tool_id=manifest.tool_id,
                    version=manifest.version,
                    effect=manifest.effect,
                    approval_requested=request.execution_options.require_approval,
                    tool_requires_approval=manifest.requires_approval,
                    source_tool=manifest.source_type is not SourceType.NATIVE,
                ),
            )
            check_parameters(self.schemas, manifest, request.parameters)
            check_resource_limits(
                request.resource_limits, manifest=manifest, fleet=self.fleet_limits
            )
            # The id is this call's, or another's: before anything of a call is stored.
            await self._claim_id(request, invocation_id)
            # Last check: a refusal above must never become the stored answer for a key.
            duplicate = await self._admit(
                event,
                request,
                invocation_id,
                manifest.tool_id,
                manifest.version,
                _rate_limits(tenant_policy, decision),
            )
            if duplicate is not None:
                return duplicate
        except ToolfleetError as exc:
            return [self._fail(event, exc, _identity_of(event, key))]

        authorized = self._authorized(event, request, invocation_id, resolved, decision)
        if decision.needs_approval:
            # Requests and control events are consumed concurrently: a cancel may have been
            # handled before this request, and a parked call would then wait forever.
            call = CallKey(tenant_id=tenant, invocation_id=invocation_id)
            if await self.cancels.is_requested(call):
                ident = _identity_of(event, key)
                return [self._fail(event, _cancelled("cancelled before it ran"), ident)]
            parked = await self._park(event, authorized, capability, decision)
            if await self.cancels.is_requested(call) and await self.approvals.take(call):
                ident = _identity_of(event, key)
                return [self._fail(event, _cancelled("cancelled before it ran"), ident)]
            return [parked]
        return await self._queue_unserved(
            self._authorize(
                event,
                authorized,
                capability.subject,
                capability.jti,
                tenant,
                filesystem_permissions=capability.filesystem_permissions,
                network_permissions=capability.network_permissions,
            ),
            authorized,
        )

    async def _claim_id(self, request: InvokeRequested, invocation_id: str) -> None:
        """Fix what ``invocation_id`` names on its first accepted request; raise
        :class:`InvocationIdConflict` when it names another call already."""
        context = request.agent_context
        identity = CallIdentity(
            tenant_id=context.tenant_id,
            agent_did=context.agent_did,
            tool_id=request.tool_id,
            requested_version=request.tool_version,
            parameters_hash=parameters_hash(
                request.tool_id, request.tool_version, request.parameters
            ),
        )
        verdict = await self.claims.claim(invocation_id, identity, ttl_s=self.claim_ttl_s)
        if verdict is ClaimVerdict.CONFLICT:
            # Says nothing of the other call (whose it is, what it runs).
            raise InvocationIdConflict(
                "this invocation id is another call's; send the request under a new id"
            )

    def _authorized(
        self,
        event: Envelope,
        request: InvokeRequested,
        invocation_id: str,
        resolved: ResolvedTool,
        decision: PolicyDecision,
    ) -> InvokeAuthorized:
        manifest = resolved.manifest
        limits = [manifest.timeout_seconds]
        if request.resource_limits.timeout_seconds:
            limits.append(request.resource_limits.timeout_seconds)
        if decision.budgets.max_runtime_ms:
            limits.append(decision.budgets.max_runtime_ms / 1000)
        return InvokeAuthorized(
            invocation_id=uuid.UUID(invocation_id),
            tool_id=manifest.tool_id,
            tool_version=manifest.version,
            requested_version=request.tool_version,
            agent_context=request.agent_context,
            parameters=request.parameters,
            connection_id=request.connection_id,
            effect=manifest.effect,
            timeout_seconds=min(limits),
            resource_limits=request.resource_limits,
            checkpoint_config=request.checkpoint_config,
            execution_options=request.execution_options,
            document_context=request.document_context,
            warnings=resolved.warnings,
            requested_at=event.time or datetime.now(UTC),
            max_result_bytes=decision.budgets.max_result_bytes,
            max_concurrent_per_agent=decision.max_concurrent_per_agent,
            pool=manifest.pool,
        )

    async def _queue_unserved(
        self, authorized_event: Emitted, authorized: InvokeAuthorized
    ) -> list[Emitted]:
        """The authorized event, and, when no executor of the call's pool is live, the
        ``queued`` notice: the call is indexed under its deadline (it ends ``timeout``
        then unless an executor of the pool has started it)."""
        pool = authorized.pool
        if self.pools is None or self.pools.is_served(pool):
            return [authorized_event]
        _, envelope = authorized_event
        queued = queued_call(envelope, authorized, pool=pool, reason="no_live_executor")
        if self.queued is not None:
            await self.queued.add(queued)
        return [authorized_event, queued_notification(queued, source=Source.POLICY)]

    def _authorize(
        self,
        parent: Envelope,
        authorized: InvokeAuthorized,
        authid: str,
        capability_jti: str,
        tenant: str,
        *,
        traceparent: str | None = None,
        filesystem_permissions: tuple[str, ...] = (),
        network_permissions: tuple[str, ...] = (),
    ) -> Emitted:
        """The ``invoke.authorized`` event, with a fresh execution grant when configured."""
        data = authorized.model_dump(mode="json")  # once: the grant goes into the dump
        if self.grants is not None:
            data["grant"] = self.grants.sign(
                call=CallRef.of(authorized),
                parameters=authorized.parameters,
                capability_jti=capability_jti,
                timeout_s=authorized.timeout_seconds,
                document_context=data["document_context"],
                filesystem_permissions=filesystem_permissions,
                network_permissions=network_permissions,
                pool=authorized.pool,
            )
        return (
            TopicName.AUTHORIZED,
            new_event(
                event_type=EventType.INVOKE_AUTHORIZED,
                source=Source.POLICY,
                data=data,
                tenant_id=tenant,
                invocation_id=str(authorized.invocation_id),
                event_id=derived_event_id(parent, EventType.INVOKE_AUTHORIZED),
                parent=parent,
                traceparent=traceparent,
                authtype=AUTHTYPE,
                authid=authid,
            ),
        )

    async def _admit(
        self,
        event: Envelope,
        request: InvokeRequested,
        invocation_id: str,
        tool_id: str,
        version: str,
        limits: RateLimits,
    ) -> list[Emitted] | None:
        """Rate limits, then the idempotency key: ``None`` to go on; else what to emit
        for a duplicate (maybe nothing yet). One round trip when both apply."""
        key = request.execution_options.idempotency_key
        tenant = request.agent_context.tenant_id
        if key and not limits.unlimited and self.admission is not None:
            admitted = await self.admission.admit(
                AdmitInput(
                    tenant_id=tenant,
                    tool_id=tool_id,
                    limits=limits,
                    idempotency_key=key,
                    invocation_id=invocation_id,
                    request_hash=parameters_hash(request.tool_id, version, request.parameters),
                    ttl_s=self.idempotency_ttl_s,
                )
            )
            if admitted.claim is None:
                raise rate_limit_error(admitted.rate)
            return await self._duplicate(event, request, invocation_id, key, admitted.claim)
        if not limits.unlimited:
            verdict = await self.limiter.acquire(tenant, tool_id, limits)
            if not verdict.allowed:
                raise rate_limit_error(verdict)
        if not key:
            return None
        digest = parameters_hash(request.tool_id, version, request.parameters)
        claim = await self.idempotency.claim(
            tenant, key, invocation_id, digest, ttl_s=self.idempotency_ttl_s
        )
        return await self._duplicate(event, request, invocation_id, key, claim)

    async def _duplicate(
        self,
        event: Envelope,
        request: InvokeRequested,
        invocation_id: str,
        key: str,
        claim: Claim,
    ) -> list[Emitted] | None:
        """What claiming ``key`` means for this request (``None``: it owns the key)."""
        if claim.kind is ClaimKind.NEW:
            return None
        if claim.kind is ClaimKind.CONFLICT:
            raise conflict_error(key, claim.first_invocation_id)
        first = claim.first_outcome()
        if first is None:
            waiter = _Waiter(
                agent_did=request.agent_context.agent_did,
                source=event.source,
                event_id=event.id,
                traceparent=event.traceparent,
            )
            try:
                owner = CallKey(
                    tenant_id=request.agent_context.tenant_id,
                    invocation_id=claim.first_invocation_id,
                )
                finished = await self.idempotency.add_waiter(
                    owner, invocation_id, waiter.model_dump_json()
                )
            except LookupError:
                return None  # the first call's key expired meanwhile: run this one
            if finished is None:
                return []  # resolved when the first invocation's outcome arrives
            first = ToolOutcome.model_validate_json(finished)
        copy = outcome_for_duplicate(
            first, invocation_id=invocation_id, agent_did=request.agent_context.agent_did
        )
        return [(TopicName.RESULTS, outcome_event(event, Source.POLICY, copy))]

    # --- invoke.results: resolve duplicates waiting on an idempotency key ----------------

    async def on_results(self, events: Sequence[Envelope]) -> list[Emitted]:
        """The outcomes owed to duplicates that waited for any of these outcomes.

        Nearly every outcome is of a call without an idempotency key, and nobody waits
        for it: which invocations may own a key is asked for all of ``events`` at once
        (one round trip), before any outcome is validated or re-serialized.
        """
        ended = [
            e
            for e in events
            if e.type in TERMINAL_TYPES and e.invocationid is not None and not _id_conflict(e)
        ]
        claimed = [_call_of(e) for e in ended]
        asked = [c for c in claimed if c is not None]
        owned = await self.idempotency.owns_keys(asked)
        owners = {c for c, owns in zip(asked, owned, strict=True) if owns}
        answering = [e for e, c in zip(ended, claimed, strict=True) if c is None or c in owners]
        answers = await asyncio.gather(*(self._answer_waiters(e) for e in answering))
        return [emitted for answer in answers for emitted in answer]

    async def _answer_waiters(self, event: Envelope) -> list[Emitted]:
        outcome = event.data_as(ToolOutcome)
        # Checked before anything is stored: a forged outcome must never become the
        # answer of an idempotency key (every later duplicate would get it).
        refusal = self._untrusted_outcome(event)
        if refusal is not None:
            return [refusal]
        call = CallKey(tenant_id=outcome.tenant_id, invocation_id=str(outcome.invocation_id))
        waiters = await self.idempotency.finish(call, outcome.model_dump_json())
        emitted: list[Emitted] = []
        for waiter in waiters:
            context = _Waiter.model_validate_json(waiter.context_json)
            parent = Envelope(
                id=context.event_id,
                source=context.source,
                type=EventType.INVOKE_REQUESTED,
                traceparent=context.traceparent,
            )
            copy = outcome_for_duplicate(
                outcome, invocation_id=waiter.invocation_id, agent_did=context.agent_did
            )
            emitted.append((TopicName.RESULTS, outcome_event(parent, Source.POLICY, copy)))
        return emitted

    def _untrusted_outcome(self, event: Envelope) -> Emitted | None:
        """The audited refusal of ``event`` unless the fleet signed it; ``None`` if it did."""
        if self.outcomes is not None:
            screened = screen(self.outcomes, [event], Source.POLICY)
            return screened.refusals[0] if screened.refusals else None
        OUTCOMES_REFUSED.labels(reader="policy", refusal=OutcomeRefusalKind.FORGED).inc()
        return refused_outcome_event(
            event,
            Source.POLICY,
            refusal=OutcomeRefusalKind.FORGED,
            reason="no outcome verification key is configured; every outcome is refused",
        )

    async def _verify(self, request: InvokeRequested) -> Capability:
        if not request.capability_token:
            raise PermissionDenied("a capability token is required")
        if self.verifier is None:
            raise PermissionDenied("no token verification key is configured; every call is denied")
        capability = await self.verifier.verify_fresh(request.capability_token)
        if self.revocations is not None:
            await ensure_not_revoked(self.revocations, capability)
        if capability.tenant_id != request.agent_context.tenant_id:
            raise PermissionDenied("capability token was issued for another tenant")
        if capability.agent_did != request.agent_context.agent_did:
            raise PermissionDenied("capability token was issued for another agent")
        if not capability.allows_tool(request.tool_id):
            raise PermissionDenied(f"capability token does not grant {request.tool_id}")
        if not capability.allows_operation("invoke"):
            raise PermissionDenied("capability token does not allow invoking tools")
        # Checked before anything resolves a secret for this connection.
        if request.connection_id and not capability.allows_connection(request.connection_id):
            raise PermissionDenied("capability token does not grant this connection")
        return capability

    async def _park(
        self,
        event: Envelope,
        authorized: InvokeAuthorized,
        capability: Capability,
        decision: PolicyDecision,
    ) -> Emitted:
        invocation_id = str(authorized.invocation_id)
        digest = parameters_hash(authorized.tool_id, authorized.tool_version, authorized.parameters)
        ttl_s = decision.approval_ttl_s or self.approval_ttl_s
        expires_at = datetime.now(UTC) + timedelta(seconds=ttl_s)
        reason = decision.reason
        await self.approvals.put(
            CallKey(tenant_id=authorized.agent_context.tenant_id, invocation_id=invocation_id),
            PendingApproval(
                authorized=authorized,
                parameters_hash=digest,
                expires_at=expires_at,
                tenant_id=authorized.agent_context.tenant_id,
                traceparent=event.traceparent,
                authid=capability.subject,
                capability_jti=capability.jti,
                filesystem_permissions=capability.filesystem_permissions,
                network_permissions=capability.network_permissions,
            ),
            ttl_s,
        )
        data = ApprovalRequested(
            invocation_id=authorized.invocation_id,
            tenant_id=authorized.agent_context.tenant_id,
            agent_did=authorized.agent_context.agent_did,
            tool_id=authorized.tool_id,
            tool_version=authorized.tool_version,
            effect=authorized.effect,
            reason=reason,
            parameters_hash=digest,
            expires_at=expires_at,
        )
        return (
            TopicName.EVENTS,
            new_event(
                event_type=EventType.APPROVAL_REQUESTED,
                source=Source.POLICY,
                data=data,
                tenant_id=data.tenant_id,
                invocation_id=invocation_id,
                event_id=derived_event_id(event, EventType.APPROVAL_REQUESTED),
                parent=event,
                authtype=AUTHTYPE,
                authid=capability.subject,
            ),
        )

    # --- control: approvals and cancellation ----------------------------------------

    async def on_control(self, event: Envelope, key: bytes | None) -> list[Emitted]:
        control: CancelRequested | ApprovalDecision
        if event.type == EventType.CANCEL_REQUESTED:
            control = event.data_as(CancelRequested)
        elif event.type in {EventType.APPROVAL_GRANTED, EventType.APPROVAL_DENIED}:
            control = event.data_as(ApprovalDecision)
        else:
            return []  # other control events are for other services
        _check_control_tenant(event, key, control.tenant_id)
        try:
            self._check_signature(event, control)
        except PermissionDenied as exc:
            return [_refused(event, control, exc)]
        if isinstance(control, CancelRequested):
            return await self._cancel(event, control)
        return await self._decide(event, control)

    def _check_signature(
        self, event: Envelope, control: CancelRequested | ApprovalDecision
    ) -> None:
        """:class:`PermissionDenied` unless the API (or a trusted CLI) signed this event."""
        if self.control is None:
            raise PermissionDenied(
                "no control signing key is configured; every control event is refused"
            )
        self.control.verify(control.signature, control_claims(event.type, control))

    async def _cancel(self, event: Envelope, cancel: CancelRequested) -> list[Emitted]:
        call = CallKey(tenant_id=cancel.tenant_id, invocation_id=str(cancel.invocation_id))
        await self.cancels.request(call)
        waiting = await self.approvals.peek(call)
        if waiting is None or waiting.tenant_id != cancel.tenant_id:
            return []
        pending = await self.approvals.take(call)
        if pending is None:
            return []
        return [self._fail_pending(event, pending, _cancelled(cancel.reason))]

    async def _decide(self, event: Envelope, decision: ApprovalDecision) -> list[Emitted]:
        call = CallKey(tenant_id=decision.tenant_id, invocation_id=str(decision.invocation_id))
        waiting = await self.approvals.peek(call)
        if waiting is None or waiting.tenant_id != decision.tenant_id:
            return []  # decided, cancelled, expired, or another tenant's: no effect
        if _requested_by(waiting, decision.approver):
            # Judged against the request policy parked, not against any projection of
            # it: the call keeps waiting for someone else, and the refusal is audited.
            error = PermissionDenied("the requesting agent cannot decide its own call")
            return [_refused(event, decision, error)]
        granted = event.type == EventType.APPROVAL_GRANTED
        if (
            granted
            and decision.parameters_hash is not None
            and decision.parameters_hash != waiting.parameters_hash
        ):
            return []  # approved something else than what waits: it keeps waiting
        # Revoked since the call was parked: it must not run on the approval. Checked
        # before ``take`` so a Redis failure here leaves the call parked for the retry.
        revoked = (
            granted
            and self.revocations is not None
            and await self.revocations.is_revoked(waiting.capability_jti)
        )
        pending = await self.approvals.take(call)
        if pending is None:
            return []  # a concurrent decision won
        if revoked:
            return [
                self._fail_pending(
                    event,
                    pending,
                    PermissionDenied("the requesting agent's capability token has been revoked"),
                )
            ]
        if pending.expires_at < datetime.now(UTC):
            return [self._fail_pending(event, pending, _approval_denied("the approval expired"))]
        if not granted:
            return [
                self._fail_pending(
                    event, pending, _approval_denied(decision.reason or "denied by an approver")
                )
            ]
        # The grant is minted now, not when the call was parked: it must outlive the run.
        return await self._queue_unserved(
            self._authorize(
                event,
                pending.authorized,
                pending.authid,
                pending.capability_jti,
                pending.tenant_id,
                traceparent=pending.traceparent,
                filesystem_permissions=pending.filesystem_permissions,
                network_permissions=pending.network_permissions,
            ),
            pending.authorized,
        )

    def _fail_pending(
        self, event: Envelope, pending: PendingApproval, error: ToolfleetError
    ) -> Emitted:
        auth = pending.authorized
        parent = event.model_copy(update={"traceparent": pending.traceparent or event.traceparent})
        return (
            TopicName.RESULTS,
            failure_event(
                parent,
                Source.POLICY,
                error,
                call=CallRef.of(auth, trace=parent.traceparent),
            ),
        )

    def _fail(self, event: Envelope, error: ToolfleetError, ident: CallRef) -> Emitted:
        return (
            TopicName.RESULTS,
            failure_event(
                event,
                Source.POLICY,
                error,
                call=ident,
            ),
        )


def _requested_by(pending: PendingApproval, approver: str) -> bool:
    """Whether ``approver`` is the agent whose request waits (its DID or token subject)."""
    return approver in {pending.authorized.agent_context.agent_did, pending.authid}


def _id_conflict(event: Envelope) -> bool:
    """An ``invocation_id_conflict`` refusal: the outcome of a request refused for
    naming another call's id, which must never stand for that call's outcome."""
    error = event.data.get("error")
    return isinstance(error, dict) and error.get("code") == ErrorCode.INVOCATION_ID_CONFLICT


def _refused(
    event: Envelope, control: CancelRequested | ApprovalDecision, error: PermissionDenied
) -> Emitted:
    """The audited refusal of a control event; the call it names is left as it was."""
    actor = control.requested_by if isinstance(control, CancelRequested) else control.approver
    data = ControlRefused(
        invocation_id=control.invocation_id,
        tenant_id=control.tenant_id,
        control_type=event.type,
        actor=actor,
        reason=error.message,
        refused_event_id=event.id,
    )
    # Whatever auth attributes the refused event carried are claims, not identities.
    parent = event.model_copy(update={"authtype": None, "authid": None})
    return (
        TopicName.EVENTS,
        new_event(
            event_type=EventType.CONTROL_REFUSED,
            source=Source.POLICY,
            data=data,
            tenant_id=control.tenant_id,
            invocation_id=str(control.invocation_id),
            event_id=derived_event_id(event, EventType.CONTROL_REFUSED),
            parent=parent,
        ),
    )


def _cancelled(reason: str) -> ToolfleetError:
    from toolfleet.errors import Cancelled

    return Cancelled(reason or "cancelled before it ran")


def _approval_denied(reason: str) -> ToolfleetError:
    from toolfleet.errors import ApprovalDenied

    return ApprovalDenied(reason)


def _key_text(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _identity_of(event: Envelope, key: bytes | None) -> CallRef:
    """Best-effort identity of a request, for the outcome when it cannot be parsed."""
    tenant = _key_text(key) or event.tenantid
    if not tenant:
        raise InvalidEvent("invoke event has neither a key nor a tenantid attribute")
    data = event.data
    agent = data.get("agent_context") if isinstance(data.get("agent_context"), dict) else {}
    raw_id = data.get("invocation_id") or event.invocationid or event.id
    tool_id = data.get("tool_id")
    agent_did = agent.get("agent_did") if isinstance(agent, dict) else None
    return CallRef(
        invocation_id=invocation_uuid(str(raw_id)[:256], tenant_id=tenant[:128]),
        tenant_id=tenant[:128],
        agent_did=agent_did[:512] if isinstance(agent_did, str) and agent_did else "unknown",
        tool_id=tool_id[:256] if isinstance(tool_id, str) and tool_id else "unknown",
        trace=event.traceparent,
    )


def _call_of(event: Envelope) -> CallKey | None:
    """The call an outcome names (its data's tenant and invocation id), read leniently:
    ``None`` when either is missing or the id is not a UUID."""
    invocation_id = _uuid_text(event.data.get("invocation_id"))
    tenant_id = event.data.get("tenant_id")
    if invocation_id is None or not isinstance(tenant_id, str) or not tenant_id:
        return None
    return CallKey(tenant_id=tenant_id, invocation_id=invocation_id)


def _uuid_text(raw: object) -> str | None:
    """``raw`` as the canonical UUID string, or ``None`` when it is not one."""
    if not isinstance(raw, str):
        return None
    try:
        return canonical_uuid(raw)
    except ValueError:
        return None


def _check_identity(event: Envelope, key: bytes | None, request: InvokeRequested) -> str:
    """Tenant in key, attribute and body agree; returns the invocation id."""
    body_tenant = request.agent_context.tenant_id
    key_tenant = _key_text(key)
    if key_tenant is not None and key_tenant != body_tenant:
        raise PermissionDenied("the message key names another tenant than agent_context.tenant_id")
    if event.tenantid is not None and event.tenantid != body_tenant:
        raise PermissionDenied(
            "the tenantid attribute names another tenant than agent_context.tenant_id"
        )
    invocation_id = (
        str(request.invocation_id)
        if request.invocation_id
        else invocation_uuid(event.id, tenant_id=body_tenant)
    )
    if (
        event.invocationid is not None
        and invocation_uuid(event.invocationid, tenant_id=body_tenant) != invocation_id
    ):
        raise InvalidEvent("the invocationid attribute differs from data.invocation_id")
    return invocation_id


def _rate_limits(tenant_policy: TenantPolicy | None, decision: PolicyDecision) -> RateLimits:
    """The buckets a call takes a token from: the tenant's and the tool's budget."""
    return RateLimits(
        tenant_per_minute=tenant_policy.budgets.max_calls_per_minute if tenant_policy else None,
        tool_per_minute=decision.budgets.max_calls_per_minute,
    )


def _check_control_tenant(event: Envelope, key: bytes | None, tenant_id: str) -> None:
    key_tenant = _key_text(key)
    if (key_tenant is not None and key_tenant != tenant_id) or (
        event.tenantid is not None and event.tenantid != tenant_id
    ):
        raise InvalidEvent("control event tenant does not match its key or tenantid attribute")
