"""Admission: a request's rate limits, then its idempotency key, as one step.

Policy takes a token from the tenant's (and the tenant + tool's) bucket and then claims
the request's idempotency key, in that order: a call refused for its rate never owns a
key. A request with both used to cost two round trips; an :class:`Admission` takes
both steps at once, with the same outcome as
:meth:`~toolfleet.policy.ratelimit.RateLimiter.acquire` followed, when allowed, by
:meth:`~toolfleet.policy.idempotency.IdempotencyStore.claim`. The Redis adapter is
:class:`toolfleet.policy.redis_stores.RedisAdmission` (one script).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from toolfleet.policy.idempotency import Claim
from toolfleet.policy.ratelimit import RateDecision, RateLimits

__all__ = ["Admission", "AdmitInput", "Admitted"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmitInput:
    """One request's rate limits and idempotency claim."""

    tenant_id: str
    tool_id: str
    """The resolved tool (its bucket)."""
    limits: RateLimits
    idempotency_key: str
    invocation_id: str
    request_hash: str
    """:func:`toolfleet.policy.service.parameters_hash` of the request."""
    ttl_s: int
    """How long the claim lives."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Admitted:
    """The rate verdict and, when allowed, what claiming the key found."""

    rate: RateDecision
    claim: Claim | None
    """``None`` when the rate limit refused the call (nothing was claimed)."""


class Admission(Protocol):
    """The port policy takes both admission steps through."""

    async def admit(self, request: AdmitInput) -> Admitted:
        """Take one token from every bucket (or none); when taken, claim the key."""
        ...
