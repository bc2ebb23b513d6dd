"""Which policy applies to a tenant, cached in process and in a shared cache (pure logic).

Lookups go local layer -> shared cache (Redis) -> source (Postgres), and the result, a
tenant's own entry *or its absence*, is remembered in both layers. Concurrent misses of
one tenant share one load (:class:`~toolfleet.coalescing.SingleFlight`). A tenant's effective
policy is its own entry, else the ``"*"`` entry, else none (deny everything).

Each tenant is cached under its own id, not under the policy it resolves to, so a
change to one tenant (or to ``"*"``) invalidates exactly one entry everywhere.

Races with invalidation are closed by generations: a load remembers the generation (or
the shared cache's epoch) it started under and keeps its result only if no
invalidation happened meanwhile, so a slow read can never re-cache a superseded policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from toolfleet.coalescing import SingleFlight
from toolfleet.policy.documents import TenantPolicy, VersionedPolicy
from toolfleet.storage.invalidation import Generations

WILDCARD_TENANT = "*"
"""The entry that applies to every tenant without one of its own."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CachedEntry:
    """A tenant's own stored policy, or the fact that it has none."""

    policy: TenantPolicy | None
    """``None``: no policy stored under this tenant id."""
    version: int = 0
    """The stored version; 0 when there is none."""


class PolicySource(Protocol):
    """Where policies live (:class:`toolfleet.policy.postgres_policies.PolicyStore`)."""

    async def get(self, tenant_id: str) -> VersionedPolicy | None: ...


class SharedPolicyCache(Protocol):
    """A cache shared by processes (:class:`toolfleet.policy.cache.RedisPolicyCache`).

    Implementations treat their own failures as misses: policy is never refused
    because the cache is down.
    """

    async def load(self, tenant_id: str) -> tuple[CachedEntry | None, str]:
        """The cached entry (``None`` on a miss) and the tenant's current epoch."""
        ...

    async def store(self, tenant_id: str, entry: CachedEntry, epoch: str) -> None:
        """Cache ``entry`` unless the tenant's epoch moved past ``epoch``."""
        ...

    async def drop(self, tenant_id: str) -> None: ...


class PolicyProvider:
    """The effective policy of a tenant, cached; one instance per process.

    Args:
        source: the policy store.
        shared: the cross-process cache, if any.
        local_ttl_s: how long the process keeps an entry (0 disables the local layer,
            e.g. where no invalidation listener runs).
        max_local_entries: bound of the local layer (cleared when exceeded).
    """

    def __init__(
        self,
        source: PolicySource,
        *,
        shared: SharedPolicyCache | None = None,
        local_ttl_s: float = 300.0,
        max_local_entries: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._shared = shared
        self._ttl = local_ttl_s
        self._max = max_local_entries
        self._clock = clock
        self._local: dict[str, tuple[CachedEntry, float]] = {}
        self._generations = Generations()
        self._loads: SingleFlight[str, tuple[int, int], CachedEntry] = SingleFlight()

    async def policy_for(self, tenant_id: str) -> TenantPolicy | None:
        """The tenant's policy, else the ``"*"`` policy, else ``None`` (deny by default)."""
        own = await self.entry(tenant_id)
        if own.policy is not None or tenant_id == WILDCARD_TENANT:
            return own.policy
        return (await self.entry(WILDCARD_TENANT)).policy

    async def entry(self, tenant_id: str) -> CachedEntry:
        """The tenant's own entry (no ``"*"`` fallback), from the nearest layer."""
        hit = self._local.get(tenant_id)
        if hit is not None and hit[1] > self._clock():
            return hit[0]
        token = self._generations.token(tenant_id)
        return await self._loads.run(tenant_id, token, lambda: self._load(tenant_id, token))

    async def _load(self, tenant_id: str, token: tuple[int, int]) -> CachedEntry:
        entry, epoch = (None, "") if self._shared is None else await self._shared.load(tenant_id)
        if entry is None:
            stored = await self._source.get(tenant_id)
            entry = (
                CachedEntry(policy=None)
                if stored is None
                else CachedEntry(policy=stored.policy, version=stored.version)
            )
            if self._shared is not None:
                await self._shared.store(tenant_id, entry, epoch)
        if self._ttl > 0 and self._generations.current(tenant_id, token):
            if len(self._local) >= self._max:
                self._local.clear()
            self._local[tenant_id] = (entry, self._clock() + self._ttl)
        return entry

    def invalidate_local(self, tenant_id: str | None = None) -> None:
        """Forget one tenant (or, with ``None``, every tenant) in this process."""
        if tenant_id is None:
            self._generations.bump_all()
            self._local.clear()
            return
        self._generations.bump(tenant_id)
        self._local.pop(tenant_id, None)

    def after_subscribe(self) -> None:
        """The ``policy:updates`` subscription is live: updates may have been missed."""
        self.invalidate_local()

    def after_connection_lost(self) -> None:
        """The ``policy:updates`` subscription is gone: forget what it kept fresh."""
        self.invalidate_local()

    async def invalidate(self, tenant_id: str) -> None:
        """Forget one tenant here and in the shared cache (on a ``policy:updates`` message)."""
        self.invalidate_local(tenant_id)
        if self._shared is not None:
            await self._shared.drop(tenant_id)
