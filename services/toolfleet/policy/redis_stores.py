"""Redis adapters for policy's ports: approvals, rate limits, idempotency.

Cancel flags, which the executor reads too, are :mod:`toolfleet.storage.cancel_flags`.

Every multi-key step runs as one Lua script (``storage/scripts/``, run by
:class:`~toolfleet.storage.lua.LuaScript`), so concurrent policy
replicas see each step as atomic. ``prefix`` namespaces every key (default: none, the
contract's names); tests use it to share one Redis safely.

A call is ``(tenant_id, invocation_id)``: every key of a call names both, the tenant as
a Redis Cluster hash tag (:mod:`toolfleet.storage.call_keys`), so another tenant that
names the same invocation id reaches none of them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime

from redis.asyncio import Redis

from toolfleet.events.identity import CallKey
from toolfleet.policy.admission import AdmitInput, Admitted
from toolfleet.policy.idempotency import DEFAULT_TTL_S, Claim, ClaimKind, Waiter
from toolfleet.policy.ratelimit import RateDecision, RateLimits
from toolfleet.policy.service import PendingApproval
from toolfleet.storage.call_keys import call_scope
from toolfleet.storage.lua import LuaScript

__all__ = [
    "RedisAdmission",
    "RedisApprovalStore",
    "RedisIdempotencyStore",
    "RedisRateLimiter",
]

_APPROVALS_DUE = LuaScript("approvals_due")
_APPROVALS_TAKE = LuaScript("approvals_take")
_RATELIMIT = LuaScript("ratelimit")
_IDEMPOTENCY_CLAIM = LuaScript("idempotency_claim")
_IDEMPOTENCY_FINISH = LuaScript("idempotency_finish")
_IDEMPOTENCY_WAIT = LuaScript("idempotency_wait")


def _as_function(name: str, script: LuaScript) -> str:
    """``script`` as a local Lua function of its own ``KEYS`` and ``ARGV``."""
    return f"local function {name}(KEYS, ARGV)\n{script.source}\nend\n"


_ADMIT = LuaScript(
    "policy_admit",
    source=_as_function("ratelimit", _RATELIMIT)
    + _as_function("claim", _IDEMPOTENCY_CLAIM)
    + """
-- KEYS: the n buckets of ratelimit.lua, then the two keys of idempotency_claim.lua.
-- ARGV[1]: n; ARGV[2 .. 2 + 3n]: ratelimit.lua's ARGV; then idempotency_claim.lua's 4.
-- Returns ratelimit.lua's refusal {0, wait}, or {1, claim reply...}.
local n = tonumber(ARGV[1])
local limit_keys, limit_args, claim_args = {}, {}, {}
for i = 1, n do limit_keys[i] = KEYS[i] end
for i = 2, 2 + 3 * n do limit_args[#limit_args + 1] = ARGV[i] end
for i = 3 + 3 * n, 6 + 3 * n do claim_args[#claim_args + 1] = ARGV[i] end
if n > 0 then
  local verdict = ratelimit(limit_keys, limit_args)
  if tonumber(verdict[1]) ~= 1 then return verdict end
end
local claimed = claim({KEYS[n + 1], KEYS[n + 2]}, claim_args)
return {1, claimed[1], claimed[2], claimed[3]}
""",
)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisApprovalStore:
    """Pending approvals, indexed by expiry so that expiring is an observable event.

    ``approval:pending:{<tenant_id>}:<invocation_id>`` holds the approval (JSON) and the
    sorted set ``approval:expiries`` its expiry (member ``{<tenant_id>}:<invocation_id>``,
    score = ``expires_at``, epoch seconds). The data key outlives the expiry by ``grace_s``
    so that a sweeper that was down can still read, and end, what expired meanwhile.
    ``take`` is atomic (GETDEL), so one decision wins; :meth:`due` moves a claimed
    approval to ``approval:expiring:{<tenant_id>}:<invocation_id>`` where ``take`` no
    longer finds it, leased to one sweeper for ``lease_s``. The index spans tenants, so
    :meth:`due` is the one script that is not cluster-safe (as before).
    """

    def __init__(
        self, redis: Redis, *, prefix: str = "", grace_s: int = 7 * 24 * 3600, lease_s: int = 60
    ) -> None:
        self._redis = redis
        self._pending = f"{prefix}approval:pending:"
        self._expiring = f"{prefix}approval:expiring:"
        self._index = f"{prefix}approval:expiries"
        self._grace_s = grace_s
        self._lease_s = lease_s

    async def put(self, call: CallKey, pending: PendingApproval, ttl_s: int) -> None:
        """Park an approval; it expires at ``pending.expires_at`` (``ttl_s`` from now)."""
        member = call_scope(call)
        async with self._redis.pipeline(transaction=True) as tx:
            tx.set(
                self._pending + member,
                pending.model_dump_json(),
                ex=max(1, ttl_s) + self._grace_s,
            )
            tx.zadd(self._index, {member: pending.expires_at.timestamp()})
            await tx.execute()

    async def peek(self, call: CallKey) -> PendingApproval | None:
        """The pending approval, left in place (to check a decision before taking it)."""
        raw = await self._redis.get(self._pending + call_scope(call))
        return None if raw is None else PendingApproval.model_validate_json(raw)

    async def take(self, call: CallKey) -> PendingApproval | None:
        """Remove and return a pending approval (``None``: decided, cancelled or expired)."""
        member = call_scope(call)
        raw = await _APPROVALS_TAKE(self._redis, [self._pending + member, self._index], [member])
        return None if raw is None else PendingApproval.model_validate_json(raw)

    async def due(self, now: datetime, *, limit: int = 100) -> list[PendingApproval]:
        """Claim up to ``limit`` approvals that expired at or before ``now`` (leased)."""
        raw = await _APPROVALS_DUE(
            self._redis,
            [self._index],
            [repr(now.timestamp()), limit, self._lease_s, self._pending, self._expiring],
        )
        return [PendingApproval.model_validate_json(item) for item in raw]

    async def ack(self, call: CallKey) -> None:
        """Forget a claimed approval once its outcome is published."""
        member = call_scope(call)
        async with self._redis.pipeline(transaction=True) as tx:
            tx.delete(self._expiring + member)
            tx.zrem(self._index, member)
            await tx.execute()


class RedisRateLimiter:
    """Token buckets ``ratelimit:{tenant}`` and ``ratelimit:{tenant}:tool`` (hashes).

    The braces are literal: a Redis Cluster hash tag, so a tenant's buckets share a slot
    and the one script may touch both (it also keeps tenant ``a:b`` apart from tenant
    ``a``'s tool ``b``). Both buckets are checked and consumed in one script, on the
    Redis server's clock (``TIME``) unless ``clock`` is given (tests). An idle bucket's
    key expires once it would be full again.
    """

    def __init__(
        self, redis: Redis, *, prefix: str = "", clock: Callable[[], float] | None = None
    ) -> None:
        self._redis = redis
        self._prefix = prefix
        self._clock = clock

    async def acquire(self, tenant_id: str, tool_id: str, limits: RateLimits) -> RateDecision:
        """Take one token from the tenant and the tenant + tool bucket, or from neither."""
        keys, args = self.script_input(tenant_id, tool_id, limits)
        if not keys:
            return RateDecision(allowed=True)
        allowed, wait = await _RATELIMIT(self._redis, keys, args)
        return _rate_decision(allowed, wait)

    def script_input(
        self, tenant_id: str, tool_id: str, limits: RateLimits
    ) -> tuple[list[str], list[str | int | float]]:
        """``KEYS`` and ``ARGV`` of ``ratelimit.lua`` for these limits (no keys: unlimited)."""
        tenant_key = f"{self._prefix}ratelimit:{{{tenant_id}}}"
        named = [
            (key, spec)
            for key, spec in (
                (tenant_key, limits.tenant_bucket()),
                (f"{tenant_key}:{tool_id}", limits.tool_bucket()),
            )
            if spec is not None
        ]
        args: list[str | int | float] = ["" if self._clock is None else repr(self._clock())]
        for _, spec in named:
            args += [repr(spec.capacity), repr(spec.rate_per_s), spec.idle_ttl_s]
        return [key for key, _ in named], args


def _rate_decision(allowed: bytes | str | int, wait: bytes | str) -> RateDecision:
    if int(allowed) == 1:
        return RateDecision(allowed=True)
    return RateDecision(allowed=False, retry_after_s=float(wait))


class RedisIdempotencyStore:
    """Idempotency keys, owners' outcomes and waiting duplicates.

    - ``idempotency:{<tenant>}:<key>``: the claim, hash ``{invocation_id, request_hash}``
    - ``idempotency:owner:{<tenant>}:<invocation_id>``: marks a call that owns a key
    - ``idempotency:outcome:{<tenant>}:<invocation_id>``: an owner's terminal outcome (JSON)
    - ``idempotency:waiters:{<tenant>}:<invocation_id>``: duplicates queued behind a
      running owner

    Every key is in its tenant's Redis Cluster slot, so the claim script may touch the
    claim, the owner marker and the owner's outcome together; and a call is
    ``(tenant, invocation)``, so an outcome of another tenant's call of the same id is
    never an owner's outcome here. All live as long as the claim (``ttl_s``). Outcomes
    are stored only for owners, so :meth:`finish` may be called for every terminal
    outcome; :meth:`owns_keys` tells first, for less: one ``EXISTS`` per outcome, a
    fetch's in one pipeline, and none for the owners this process claimed itself
    (remembered until they finish, up to ``max_local_owners``).
    """

    def __init__(self, redis: Redis, *, prefix: str = "", max_local_owners: int = 100_000) -> None:
        self._redis = redis
        self._prefix = f"{prefix}idempotency:"
        self._claimed: dict[CallKey, None] = {}  # owners claimed here, oldest first
        self._max_claimed = max_local_owners

    def _claim_key(self, tenant_id: str, key: str) -> str:
        return f"{self._prefix}{{{tenant_id}}}:{key}"

    def _owner(self, call: CallKey) -> str:
        return f"{self._prefix}owner:{call_scope(call)}"

    def _outcome(self, call: CallKey) -> str:
        return f"{self._prefix}outcome:{call_scope(call)}"

    def _waiters(self, call: CallKey) -> str:
        return f"{self._prefix}waiters:{call_scope(call)}"

    async def claim(
        self,
        tenant_id: str,
        key: str,
        invocation_id: str,
        request_hash: str,
        ttl_s: int = DEFAULT_TTL_S,
    ) -> Claim:
        """Atomically own ``key`` for ``invocation_id`` or report who owns it."""
        keys, args = self.script_input(tenant_id, key, invocation_id, request_hash, ttl_s)
        call = CallKey(tenant_id=tenant_id, invocation_id=invocation_id)
        return self.claimed(call, await _IDEMPOTENCY_CLAIM(self._redis, keys, args))

    def script_input(
        self, tenant_id: str, key: str, invocation_id: str, request_hash: str, ttl_s: int
    ) -> tuple[list[str], list[str | int | float]]:
        """``KEYS`` and ``ARGV`` of ``idempotency_claim.lua``.

        The outcome prefix names the tenant's outcomes: the owner a claim finds is an
        invocation of the same tenant (claims are per tenant), and its outcome key is
        in the same slot as the claim.
        """
        call = CallKey(tenant_id=tenant_id, invocation_id=invocation_id)
        return (
            [self._claim_key(tenant_id, key), self._owner(call)],
            [invocation_id, request_hash, ttl_s, f"{self._prefix}outcome:{{{tenant_id}}}:"],
        )

    def claimed(self, call: CallKey, reply: list[bytes | str | None]) -> Claim:
        """The :class:`Claim` that ``idempotency_claim.lua`` replied for ``call``."""
        kind = ClaimKind(_text(_present(reply[0])))
        outcome = reply[2] if len(reply) > 2 and reply[2] is not None else None
        if kind is ClaimKind.NEW:
            self._remember_owner(call)
        return Claim(
            kind=kind,
            first_invocation_id=_text(_present(reply[1])),
            outcome_json=None if outcome is None else _text(outcome),
        )

    async def record_outcome(self, call: CallKey, outcome_json: str) -> bool:
        """Store an owner's terminal outcome; ``False`` (no-op) when it owns no key.

        Record before :meth:`take_waiters` (or use :meth:`finish`): a duplicate that
        arrives in between then finds the outcome instead of queuing.
        """
        reply = await self._finish(call, outcome_json, store=True, take=False)
        return int(reply[0]) == 1

    async def add_waiter(
        self, first: CallKey, waiter_invocation_id: str, waiter_context_json: str
    ) -> str | None:
        """Queue a duplicate behind the owner, or return the owner's outcome if finished.

        Raises:
            LookupError: the owner's claim is gone (expired), so nothing will resolve
                the duplicate.
        """
        waiter = json.dumps({"invocation_id": waiter_invocation_id, "context": waiter_context_json})
        reply = await _IDEMPOTENCY_WAIT(
            self._redis,
            [self._owner(first), self._outcome(first), self._waiters(first)],
            [waiter],
        )
        match _text(reply[0]):
            case "finished":
                return _text(reply[1])
            case "queued":
                return None
            case _:
                raise LookupError(f"invocation {first.invocation_id} owns no idempotency key")

    async def take_waiters(self, first: CallKey) -> list[Waiter]:
        """Remove and return the duplicates queued behind an owner (atomic)."""
        reply = await self._finish(first, "", store=False, take=True)
        return _waiters(reply[1:])

    async def finish(self, call: CallKey, outcome_json: str) -> list[Waiter]:
        """Record an owner's outcome and take its waiters in one atomic step.

        Call it for every terminal outcome: for an invocation that owns no key it
        stores nothing and returns no waiters.
        """
        reply = await self._finish(call, outcome_json, store=True, take=True)
        self._claimed.pop(call, None)
        return _waiters(reply[1:])

    async def owns_keys(self, calls: Sequence[CallKey]) -> list[bool]:
        """Whether each of ``calls`` owns a key or has duplicates queued behind it: one
        ``EXISTS`` each, in one pipeline, for those not claimed here."""
        asked = [c for c in calls if c not in self._claimed]
        found: dict[CallKey, bool] = {}
        if asked:
            pipe = self._redis.pipeline(transaction=False)
            for call in asked:
                pipe.exists(self._owner(call), self._waiters(call))
            found = dict(zip(asked, map(bool, await pipe.execute()), strict=True))
        return [found.get(c, True) for c in calls]

    def _remember_owner(self, call: CallKey) -> None:
        if len(self._claimed) >= self._max_claimed:
            del self._claimed[next(iter(self._claimed))]
        self._claimed[call] = None

    async def _finish(
        self, call: CallKey, outcome_json: str, *, store: bool, take: bool
    ) -> list[bytes | str | int]:
        reply: list[bytes | str | int] = await _IDEMPOTENCY_FINISH(
            self._redis,
            [self._owner(call), self._outcome(call), self._waiters(call)],
            [outcome_json, "1" if store else "", "1" if take else ""],
        )
        return reply


class RedisAdmission:
    """:class:`~toolfleet.policy.admission.Admission` over the two stores' keys.

    ``ratelimit.lua`` and then, when it allowed the call, ``idempotency_claim.lua``,
    run as one script: each is a function of ``policy_admit``, called with its own
    ``KEYS`` and ``ARGV``, so the two steps stay the ones the stores run alone.
    """

    def __init__(self, limiter: RedisRateLimiter, idempotency: RedisIdempotencyStore) -> None:
        self._redis = idempotency._redis
        self._limiter = limiter
        self._idempotency = idempotency

    async def admit(self, request: AdmitInput) -> Admitted:
        """Take one token from every bucket (or none); when taken, claim the key."""
        limit_keys, limit_args = self._limiter.script_input(
            request.tenant_id, request.tool_id, request.limits
        )
        claim_keys, claim_args = self._idempotency.script_input(
            request.tenant_id,
            request.idempotency_key,
            request.invocation_id,
            request.request_hash,
            request.ttl_s,
        )
        reply = await _ADMIT(
            self._redis,
            [*limit_keys, *claim_keys],
            [len(limit_keys), *limit_args, *claim_args],
        )
        if int(reply[0]) != 1:
            return Admitted(rate=_rate_decision(reply[0], reply[1]), claim=None)
        call = CallKey(tenant_id=request.tenant_id, invocation_id=request.invocation_id)
        claim = self._idempotency.claimed(call, reply[1:])
        return Admitted(rate=RateDecision(allowed=True), claim=claim)


def _present(value: bytes | str | None) -> bytes | str:
    if value is None:
        raise ValueError("the idempotency script replied no value")
    return value


def _waiters(raw: list[bytes | str | int]) -> list[Waiter]:
    items = [json.loads(item) for item in raw if not isinstance(item, int)]
    return [Waiter(invocation_id=i["invocation_id"], context_json=i["context"]) for i in items]
