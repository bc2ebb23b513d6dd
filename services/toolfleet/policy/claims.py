"""Invocation ids: the first accepted request fixes what an id names.

An invocation id is chosen by its producer, so nothing stops a later request from
naming an id that is already another call's: the same agent swapping the tool or the
parameters of its call that waits for approval, another tenant taking over a pending
or running call, or its idempotency key. The first request policy accepts for an id
fixes its :class:`CallIdentity` (tenant, agent, tool, requested version, parameters
hash). A later request with the same identity is the same call (a redelivery or a
re-send: handled as before); one with any field different is refused to its sender
only (:class:`~toolfleet.errors.InvocationIdConflict`) and changes nothing of the
first call.

Policy claims the id once every other check has passed and before anything of the
call is stored (idempotency key, pending approval), so a refused request fixes
nothing and a conflicting one reaches nothing. The claim lives as long as the call
can still be decided or deduplicated (``ttl_s``).

The Redis adapter is one script (``storage/scripts/invocation_claim.lua``) on the key
``invocation:claim:{<invocation_id>}`` (a Redis Cluster hash tag); the key is not
scoped by tenant on purpose: it is what tells two tenants' calls of one id apart.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from redis.asyncio import Redis

from toolfleet.storage.lua import LuaScript

__all__ = [
    "CallIdentity",
    "ClaimVerdict",
    "InvocationClaims",
    "MemoryInvocationClaims",
    "RedisInvocationClaims",
]

DEFAULT_CLAIM_TTL_S = 7 * 24 * 3600
"""How long an id stays claimed: as long as an idempotency key is remembered."""

_INVOCATION_CLAIM = LuaScript("invocation_claim")


@dataclass(frozen=True, slots=True, kw_only=True)
class CallIdentity:
    """What the first accepted request of an invocation id fixes."""

    tenant_id: str
    agent_did: str
    tool_id: str
    requested_version: str
    """``tool_version`` as requested (a range or ``*``), not the resolved version: the
    same request resolves to a newer version after a release, and stays the same call."""
    parameters_hash: str
    """:func:`toolfleet.policy.service.parameters_hash` of the tool, requested version
    and parameters."""

    def encode(self) -> str:
        """One string for the whole identity: equal identities, and only they, give equal
        strings (a JSON array: no field's text can run into the next field)."""
        return json.dumps(
            [
                self.tenant_id,
                self.agent_did,
                self.tool_id,
                self.requested_version,
                self.parameters_hash,
            ],
            separators=(",", ":"),
        )


class ClaimVerdict(StrEnum):
    """What claiming an invocation id found."""

    NEW = "new"
    """This request fixed the id: it is the first accepted one."""
    SAME = "same"
    """The id is already this call's (same identity): a redelivery or a re-send."""
    CONFLICT = "conflict"
    """The id is another call's: refuse this request, touch nothing of that call."""


class InvocationClaims(Protocol):
    """Where ids are claimed (Redis: :class:`RedisInvocationClaims`)."""

    async def claim(
        self, invocation_id: str, identity: CallIdentity, *, ttl_s: int = DEFAULT_CLAIM_TTL_S
    ) -> ClaimVerdict:
        """Atomically claim ``invocation_id`` for ``identity`` unless it is claimed; the
        verdict compares with the identity that claimed it first."""
        ...


@dataclass
class MemoryInvocationClaims:
    """The claims of one process (nothing expires: TTLs are the adapter's business)."""

    claimed: dict[str, str] = field(default_factory=dict)

    async def claim(
        self, invocation_id: str, identity: CallIdentity, *, ttl_s: int = DEFAULT_CLAIM_TTL_S
    ) -> ClaimVerdict:
        encoded = identity.encode()
        first = self.claimed.get(invocation_id)
        if first is None:
            self.claimed[invocation_id] = encoded
            return ClaimVerdict.NEW
        return ClaimVerdict.SAME if first == encoded else ClaimVerdict.CONFLICT


class RedisInvocationClaims:
    """``invocation:claim:{<invocation_id>}`` → the encoded identity, for ``ttl_s``."""

    def __init__(self, redis: Redis, *, prefix: str = "") -> None:
        self._redis = redis
        self._prefix = f"{prefix}invocation:claim:"

    async def claim(
        self, invocation_id: str, identity: CallIdentity, *, ttl_s: int = DEFAULT_CLAIM_TTL_S
    ) -> ClaimVerdict:
        reply = await _INVOCATION_CLAIM(
            self._redis,
            [f"{self._prefix}{{{invocation_id}}}"],
            [identity.encode(), max(1, ttl_s)],
        )
        return ClaimVerdict(reply.decode() if isinstance(reply, bytes) else reply)
