"""In-memory twins of policy's ports, for unit tests and one-process fleets.

Each keeps the contract of its Redis adapter (:mod:`toolfleet.policy.redis_stores`) in
one process: a ``take`` wins once, a key has one owner, a finished owner's outcome
answers its duplicates. Nothing expires: time is the subject of other tests (TTLs are
the adapters' business and are tested against Redis).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from toolfleet.events.identity import CallKey
from toolfleet.policy.documents import TenantPolicy
from toolfleet.policy.idempotency import DEFAULT_TTL_S, Claim, ClaimKind, Waiter
from toolfleet.policy.service import PendingApproval

__all__ = ["MemoryApprovalStore", "MemoryIdempotencyStore", "StaticPolicies"]


@dataclass
class StaticPolicies:
    """Tenant policies fixed at construction (the twin of the cached provider)."""

    policies: dict[str, TenantPolicy] = field(default_factory=dict)
    """Per tenant id; ``"*"`` applies to a tenant without its own entry."""

    async def policy_for(self, tenant_id: str) -> TenantPolicy | None:
        return self.policies.get(tenant_id, self.policies.get("*"))


@dataclass
class MemoryApprovalStore:
    """Parked approvals by call (tenant and invocation); :meth:`take` hands one out once."""

    pending: dict[CallKey, PendingApproval] = field(default_factory=dict)

    async def put(self, call: CallKey, pending: PendingApproval, ttl_s: int) -> None:
        self.pending[call] = pending

    async def peek(self, call: CallKey) -> PendingApproval | None:
        return self.pending.get(call)

    async def take(self, call: CallKey) -> PendingApproval | None:
        return self.pending.pop(call, None)


@dataclass
class _Key:
    invocation_id: str
    request_hash: str


@dataclass
class MemoryIdempotencyStore:
    """Idempotency claims, owners' outcomes and queued duplicates, per tenant and key;
    owners are calls (tenant and invocation)."""

    _claims: dict[tuple[str, str], _Key] = field(default_factory=dict)
    _owners: set[CallKey] = field(default_factory=set)
    _outcomes: dict[CallKey, str] = field(default_factory=dict)
    _waiters: dict[CallKey, list[Waiter]] = field(default_factory=dict)

    async def claim(
        self,
        tenant_id: str,
        key: str,
        invocation_id: str,
        request_hash: str,
        ttl_s: int = DEFAULT_TTL_S,
    ) -> Claim:
        owner = self._claims.get((tenant_id, key))
        if owner is None or owner.invocation_id == invocation_id:
            self._claims[(tenant_id, key)] = _Key(invocation_id, request_hash)
            self._owners.add(CallKey(tenant_id=tenant_id, invocation_id=invocation_id))
            return Claim(kind=ClaimKind.NEW, first_invocation_id=invocation_id)
        if owner.request_hash != request_hash:
            return Claim(kind=ClaimKind.CONFLICT, first_invocation_id=owner.invocation_id)
        first = CallKey(tenant_id=tenant_id, invocation_id=owner.invocation_id)
        return Claim(
            kind=ClaimKind.DUPLICATE,
            first_invocation_id=owner.invocation_id,
            outcome_json=self._outcomes.get(first),
        )

    async def record_outcome(self, call: CallKey, outcome_json: str) -> bool:
        if call not in self._owners:
            return False
        self._outcomes[call] = outcome_json
        return True

    async def add_waiter(
        self, first: CallKey, waiter_invocation_id: str, waiter_context_json: str
    ) -> str | None:
        if (outcome := self._outcomes.get(first)) is not None:
            return outcome
        if first not in self._owners:
            raise LookupError(f"invocation {first.invocation_id} owns no idempotency key")
        waiter = Waiter(invocation_id=waiter_invocation_id, context_json=waiter_context_json)
        self._waiters.setdefault(first, []).append(waiter)
        return None

    async def take_waiters(self, first: CallKey) -> list[Waiter]:
        return self._waiters.pop(first, [])

    async def finish(self, call: CallKey, outcome_json: str) -> list[Waiter]:
        await self.record_outcome(call, outcome_json)
        return await self.take_waiters(call)

    async def owns_keys(self, calls: Sequence[CallKey]) -> list[bool]:
        return [c in self._owners or c in self._waiters for c in calls]
