"""Idempotency keys: a second request with the same key runs nothing.

``execution_options.idempotency_key`` is unique per tenant. The first invocation to
claim a key owns it; a later request with the same key and the same request (tool,
resolved version, parameters: see :func:`toolfleet.policy.service.parameters_hash`)
is a *duplicate* and resolves to the owner's outcome, and one with a different request
is a *conflict* (``idempotency_conflict``). A duplicate that arrives while the owner
still runs waits: it is queued behind the owner and resolved when the owner's terminal
outcome is seen.

The flow, for policy::

    claim = await store.claim(tenant, key, invocation_id, request_hash)
    match claim.kind:
        case ClaimKind.NEW:        authorize as usual
        case ClaimKind.CONFLICT:   fail with IdempotencyConflict
        case ClaimKind.DUPLICATE if claim.outcome_json: emit outcome_for_duplicate(...)
        case ClaimKind.DUPLICATE:
            first = CallKey(tenant_id=tenant, invocation_id=claim.first_invocation_id)
            outcome = await store.add_waiter(first, invocation_id, ctx)
            emit outcome_for_duplicate(...) now if outcome is not None, else later

    # on every terminal outcome seen on invoke.results (of an owner: owns_keys):
    call = CallKey(tenant_id=outcome.tenant_id, invocation_id=str(outcome.invocation_id))
    for waiter in await store.finish(call, outcome_json):
        emit outcome_for_duplicate(outcome, invocation_id=waiter.invocation_id, ...)

An owner is a call, ``(tenant_id, invocation_id)``: an outcome of another tenant's call
that happens to use the same invocation id neither resolves nor reads this tenant's
duplicates.

This module is the domain side (port, claim, outcome copy); the Redis adapter is
:class:`toolfleet.policy.redis_stores.RedisIdempotencyStore`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from toolfleet.errors import IdempotencyConflict
from toolfleet.events.identity import CallKey
from toolfleet.events.models import ToolOutcome

__all__ = [
    "DEFAULT_TTL_S",
    "Claim",
    "ClaimKind",
    "IdempotencyStore",
    "Waiter",
    "conflict_error",
    "outcome_for_duplicate",
]

DEFAULT_TTL_S = 24 * 3600
"""How long a key is remembered (and a finished owner's outcome with it)."""


class ClaimKind(StrEnum):
    """What claiming an idempotency key found."""

    NEW = "new"
    """This invocation owns the key (also when the owner claims again on redelivery)."""
    DUPLICATE = "duplicate"
    """Another invocation owns the key for the same request: run nothing."""
    CONFLICT = "conflict"
    """Another invocation owns the key for a different request."""


@dataclass(frozen=True, kw_only=True)
class Claim:
    """The answer to :meth:`IdempotencyStore.claim`."""

    kind: ClaimKind
    first_invocation_id: str
    """The owner of the key (this invocation when ``kind`` is ``new``)."""
    outcome_json: str | None = None
    """For a duplicate of a finished owner: the owner's terminal outcome (JSON)."""

    def first_outcome(self) -> ToolOutcome | None:
        """The owner's outcome, parsed, when it has finished."""
        if self.outcome_json is None:
            return None
        return ToolOutcome.model_validate_json(self.outcome_json)


@dataclass(frozen=True, kw_only=True)
class Waiter:
    """A duplicate queued behind a running owner."""

    invocation_id: str
    context_json: str
    """Whatever the caller needs to answer the duplicate later (its own JSON)."""


class IdempotencyStore(Protocol):
    """The port policy claims idempotency keys and resolves duplicates through."""

    async def claim(
        self,
        tenant_id: str,
        key: str,
        invocation_id: str,
        request_hash: str,
        ttl_s: int = DEFAULT_TTL_S,
    ) -> Claim:
        """Atomically own ``key`` for ``invocation_id`` or report who owns it."""
        ...

    async def record_outcome(self, call: CallKey, outcome_json: str) -> bool:
        """Store an owner's terminal outcome; ``False`` (no-op) when it owns no key."""
        ...

    async def add_waiter(
        self, first: CallKey, waiter_invocation_id: str, waiter_context_json: str
    ) -> str | None:
        """Queue a duplicate behind the owner (``first``, a call of the duplicate's tenant).

        Returns the owner's outcome JSON instead when the owner has already finished
        (the duplicate is then *not* queued: answer it now).
        """
        ...

    async def take_waiters(self, first: CallKey) -> list[Waiter]:
        """Remove and return the duplicates queued behind an owner (atomic)."""
        ...

    async def finish(self, call: CallKey, outcome_json: str) -> list[Waiter]:
        """:meth:`record_outcome` and :meth:`take_waiters` as one atomic step."""
        ...

    async def owns_keys(self, calls: Sequence[CallKey]) -> list[bool]:
        """Whether each of ``calls`` may own a key, asked in one round trip.

        ``False`` means :meth:`finish` would store nothing and return no waiters, so an
        outcome can be passed over without being decoded; ``True`` may be a false alarm
        (:meth:`finish` decides).
        """
        ...


def conflict_error(key: str, first_invocation_id: str) -> IdempotencyConflict:
    """The contract error for a key reused with a different request."""
    return IdempotencyConflict(
        "the idempotency key was already used for a different request",
        details={"idempotency_key": key, "first_invocation_id": first_invocation_id},
    )


def outcome_for_duplicate(
    first: ToolOutcome, *, invocation_id: str | uuid.UUID, agent_did: str
) -> ToolOutcome:
    """The duplicate's terminal outcome: the owner's, under the duplicate's identity.

    Status, result, error, warnings, execution metadata, resolved version and checkpoint
    reference are the owner's. ``execution_metadata`` is copied unchanged (``cached``
    stays as the owner reported it): the duration and timestamps describe the one real
    execution, which is what a client comparing the two should see. The tenant and tool
    are the owner's too; they are the duplicate's by construction (keys are per tenant,
    and a different tool would have been a conflict).
    """
    return first.model_copy(
        update={
            "invocation_id": uuid.UUID(str(invocation_id)),
            "agent_did": agent_did,
        },
        deep=True,
    )
