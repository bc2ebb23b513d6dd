"""PolicyProvider: tenant -> "*" -> deny, both cache layers, invalidation races; catalog pages."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from toolfleet.policy.catalog import CatalogView, visible_page
from toolfleet.policy.documents import TenantPolicy, VersionedPolicy
from toolfleet.policy.provider import CachedEntry, PolicyProvider

pytestmark = pytest.mark.unit

CORE = TenantPolicy(allow_tools=["core__*"])
ACME = TenantPolicy(allow_tools=["acme__*"])


class Source:
    """An in-memory policy store counting its reads."""

    def __init__(self, policies: dict[str, TenantPolicy]) -> None:
        self.policies = dict(policies)
        self.reads: list[str] = []

    async def get(self, tenant_id: str) -> VersionedPolicy | None:
        self.reads.append(tenant_id)
        policy = self.policies.get(tenant_id)
        return None if policy is None else VersionedPolicy(policy, 1)


class Shared:
    """An in-memory shared cache with epochs, like the Redis one."""

    def __init__(self) -> None:
        self.entries: dict[str, CachedEntry] = {}
        self.epochs: dict[str, int] = {}

    async def load(self, tenant_id: str) -> tuple[CachedEntry | None, str]:
        return self.entries.get(tenant_id), str(self.epochs.get(tenant_id, 0))

    async def store(self, tenant_id: str, entry: CachedEntry, epoch: str) -> None:
        if str(self.epochs.get(tenant_id, 0)) == epoch:
            self.entries[tenant_id] = entry

    async def drop(self, tenant_id: str) -> None:
        self.entries.pop(tenant_id, None)

    def announce(self, tenant_id: str) -> None:
        self.epochs[tenant_id] = self.epochs.get(tenant_id, 0) + 1
        self.entries.pop(tenant_id, None)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_falls_back_from_tenant_to_wildcard_to_deny() -> None:
    provider = PolicyProvider(Source({"acme": ACME, "*": CORE}))
    assert await provider.policy_for("acme") == ACME
    assert await provider.policy_for("other") == CORE
    assert await PolicyProvider(Source({"acme": ACME})).policy_for("other") is None
    assert await PolicyProvider(Source({})).policy_for("*") is None


async def test_local_layer_hits_until_ttl_or_invalidation() -> None:
    source, clock = Source({"acme": ACME}), Clock()
    provider = PolicyProvider(source, local_ttl_s=10, clock=clock)
    await provider.policy_for("acme")
    await provider.policy_for("acme")
    assert source.reads == ["acme"]
    clock.now = 11
    await provider.policy_for("acme")
    assert source.reads == ["acme", "acme"]
    source.policies["acme"] = CORE
    provider.invalidate_local("acme")
    assert await provider.policy_for("acme") == CORE


async def test_absence_is_cached_too() -> None:
    source = Source({"*": CORE})
    provider = PolicyProvider(source)
    await provider.policy_for("t1")
    await provider.policy_for("t1")
    assert source.reads == ["t1", "*"]


async def test_shared_layer_serves_other_processes() -> None:
    source, shared = Source({"acme": ACME}), Shared()
    await PolicyProvider(source, shared=shared).policy_for("acme")
    other = PolicyProvider(source, shared=shared)
    assert await other.policy_for("acme") == ACME
    assert source.reads == ["acme"]


async def test_a_read_racing_an_update_is_not_cached() -> None:
    shared = Shared()

    class RacingSource(Source):
        racing = True

        async def get(self, tenant_id: str) -> VersionedPolicy | None:
            found = await super().get(tenant_id)
            if self.racing:  # the writer commits and announces, the listener fires, mid-read
                self.racing = False
                self.policies[tenant_id] = CORE
                shared.announce(tenant_id)
                provider.invalidate_local(tenant_id)
            return found

    source = RacingSource({"acme": ACME})
    provider = PolicyProvider(source, shared=shared)
    assert await provider.policy_for("acme") == ACME  # this read saw the old policy...
    assert "acme" not in shared.entries  # ...but did not cache it anywhere
    assert await provider.policy_for("acme") == CORE


async def test_invalidate_drops_both_layers() -> None:
    source, shared = Source({"acme": ACME}), Shared()
    provider = PolicyProvider(source, shared=shared)
    await provider.policy_for("acme")
    source.policies["acme"] = CORE
    await provider.invalidate("acme")
    assert await provider.policy_for("acme") == CORE


async def test_no_local_layer_when_ttl_is_zero() -> None:
    source = Source({"acme": ACME})
    provider = PolicyProvider(source, local_ttl_s=0)
    await provider.policy_for("acme")
    await provider.policy_for("acme")
    assert source.reads == ["acme", "acme"]


# --- catalog -------------------------------------------------------------------------

TOOLS = [f"core__t{i:02}" for i in range(7)] + ["acme__a", "acme__b"]


async def fetch(limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
    return [{"tool_id": t} for t in sorted(TOOLS)[offset : offset + limit]], len(TOOLS)


async def test_catalog_pages_over_allowed_tools_only() -> None:
    view = CatalogView(policy=TenantPolicy(allow_tools=["core__*"], deny_tools=["core__t03"]))
    rows, total = await visible_page(view, fetch, offset=2, limit=3, chunk=2)
    assert total == 6
    assert [r["tool_id"] for r in rows] == ["core__t02", "core__t04", "core__t05"]


async def test_catalog_for_admins_and_for_no_policy() -> None:
    rows, total = await visible_page(
        CatalogView(policy=None, everything=True), fetch, offset=0, limit=50
    )
    assert total == len(TOOLS)
    assert len(rows) == len(TOOLS)
    assert await visible_page(CatalogView(policy=None), fetch, offset=0, limit=50) == ([], 0)


class HeldSource(Source):
    """Reads that wait until released: the misses of a cold cache arrive together."""

    def __init__(self, policies: dict[str, TenantPolicy]) -> None:
        super().__init__(policies)
        self.release = asyncio.Event()
        self.reading = asyncio.Event()

    async def get(self, tenant_id: str) -> VersionedPolicy | None:
        found = await super().get(tenant_id)
        self.reading.set()
        await self.release.wait()
        return found


async def test_a_burst_of_misses_for_one_tenant_reads_the_store_once() -> None:
    source = HeldSource({"acme": ACME})
    provider = PolicyProvider(source, shared=Shared())
    burst = [asyncio.ensure_future(provider.policy_for("acme")) for _ in range(50)]
    await source.reading.wait()
    source.release.set()
    assert await asyncio.gather(*burst) == [ACME] * 50
    assert source.reads == ["acme"]


async def test_a_miss_after_an_invalidation_never_joins_a_read_from_before_it() -> None:
    source = HeldSource({"acme": ACME})
    provider = PolicyProvider(source, shared=Shared())
    before = asyncio.ensure_future(provider.policy_for("acme"))
    await source.reading.wait()  # its read is under way, and saw ACME
    source.policies["acme"] = CORE  # a writer commits and announces
    provider.invalidate_local("acme")
    after = asyncio.ensure_future(provider.policy_for("acme"))
    await asyncio.sleep(0)
    source.release.set()
    assert await before == ACME
    assert await after == CORE  # its own read, after the change
    assert source.reads == ["acme", "acme"]


async def test_a_failed_shared_read_fails_every_joiner_and_the_next_miss_tries_again() -> None:
    class Failing(HeldSource):
        fail = True

        async def get(self, tenant_id: str) -> VersionedPolicy | None:
            found = await super().get(tenant_id)
            if self.fail:
                self.fail = False
                raise ConnectionError("postgres went away")
            return found

    source = Failing({"acme": ACME})
    provider = PolicyProvider(source, shared=Shared())
    burst = [asyncio.ensure_future(provider.policy_for("acme")) for _ in range(3)]
    await source.reading.wait()
    source.release.set()
    results = await asyncio.gather(*burst, return_exceptions=True)
    assert all(isinstance(r, ConnectionError) for r in results)
    assert await provider.policy_for("acme") == ACME
