"""In-memory twins of policy's ports, for unit tests and one-process fleets.

Each keeps the contract of its Redis adapter (:mod:`toolfleet.policy.redis_stores`) in
one process: a ``take`` wins once, a key has one owner, a finished owner's outcome
answers its duplicates. Nothing expires: time is the subject of other tests (TTLs are
the adapters' business and are tested against Redis).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

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
    """Parked approvals by invocation id; :meth:`take` hands one out once."""

    pending: dict[str, PendingApproval] = field(default_factory=dict)

    async def put(self, invocation_id: str, pending: PendingApproval, ttl_s: int) -> None:
        self.pending[invocation_id] = pending

    async def peek(self, invocation_id: str) -> PendingApproval | None:
        return self.pending.get(invocation_id)

    async def take(self, invocation_id: str) -> PendingApproval | None:
        return self.pending.pop(invocation_id, None)


@dataclass
class _Key:
    invocation_id: str
    request_hash: str


@dataclass
class MemoryIdempotencyStore:
    """Idempotency claims, owners' outcomes and queued duplicates, per tenant and key."""

    _claims: dict[tuple[str, str], _Key] = field(default_factory=dict)
    _owners: set[str] = field(default_factory=set)
    _outcomes: dict[str, str] = field(default_factory=dict)
    _waiters: dict[str, list[Waiter]] = field(default_factory=dict)

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
            self._owners.add(invocation_id)
            return Claim(kind=ClaimKind.NEW, first_invocation_id=invocation_id)
        if owner.request_hash != request_hash:
            return Claim(kind=ClaimKind.CONFLICT, first_invocation_id=owner.invocation_id)
        return Claim(
            kind=ClaimKind.DUPLICATE,
            first_invocation_id=owner.invocation_id,
            outcome_json=self._outcomes.get(owner.invocation_id),
        )

    async def record_outcome(self, invocation_id: str, outcome_json: str) -> bool:
        if invocation_id not in self._owners:
            return False
        self._outcomes[invocation_id] = outcome_json
        return True

    async def add_waiter(
        self, first_invocation_id: str, waiter_invocation_id: str, waiter_context_json: str
    ) -> str | None:
        if (outcome := self._outcomes.get(first_invocation_id)) is not None:
            return outcome
        if first_invocation_id not in self._owners:
            raise LookupError(f"invocation {first_invocation_id} owns no idempotency key")
        waiter = Waiter(invocation_id=waiter_invocation_id, context_json=waiter_context_json)
        self._waiters.setdefault(first_invocation_id, []).append(waiter)
        return None

    async def take_waiters(self, first_invocation_id: str) -> list[Waiter]:
        return self._waiters.pop(first_invocation_id, [])

    async def finish(self, invocation_id: str, outcome_json: str) -> list[Waiter]:
        await self.record_outcome(invocation_id, outcome_json)
        return await self.take_waiters(invocation_id)

    async def owns_keys(self, invocation_ids: Sequence[str]) -> list[bool]:
        return [i in self._owners or i in self._waiters for i in invocation_ids]
