"""The per-process revocation cache: trusted only while its invalidation channel is live."""

from __future__ import annotations

import asyncio

import pytest

from toolfleet.auth.grants import ExecutionGrant
from toolfleet.errors import PermissionDenied
from toolfleet.storage.revocation import (
    CachedRevocationList,
    MemoryRevocationList,
    ensure_grant_not_revoked,
)

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class CountingSource(MemoryRevocationList):
    """The truth, counting how often it is asked."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(clock=clock)
        self.reads = 0

    async def is_revoked(self, jti: str) -> bool:
        self.reads += 1
        return await super().is_revoked(jti)


def cached(ttl_s: float = 10.0) -> tuple[CachedRevocationList, CountingSource, Clock]:
    clock = Clock()
    source = CountingSource(clock)
    return CachedRevocationList(source, ttl_s=ttl_s, clock=clock), source, clock


async def test_answers_are_remembered_for_the_ttl_once_subscribed() -> None:
    revocations, source, clock = cached(ttl_s=10)
    revocations.after_subscribe()
    assert not await revocations.is_revoked("j1")
    assert not await revocations.is_revoked("j1")
    assert source.reads == 1
    # Revoked behind the cache's back (no announcement): the TTL bounds how long it shows.
    await source.revoke("j1", ttl_s=600)
    clock.now = 9.9
    assert not await revocations.is_revoked("j1")
    clock.now = 10.1
    assert await revocations.is_revoked("j1")
    assert source.reads == 2


async def test_an_announced_revocation_drops_the_cached_answer_at_once() -> None:
    revocations, source, _ = cached(ttl_s=300)
    revocations.after_subscribe()
    assert not await revocations.is_revoked("j1")
    await source.revoke("j1", ttl_s=600)
    await revocations.invalidate("j1")
    assert await revocations.is_revoked("j1")


async def test_nothing_is_cached_without_a_live_subscription() -> None:
    revocations, source, _ = cached()
    for _ in range(3):  # no listener ever subscribed
        assert not await revocations.is_revoked("j1")
    assert source.reads == 3

    revocations.after_subscribe()
    assert not await revocations.is_revoked("j1")
    revocations.after_connection_lost()  # fail safe: the cached answer goes too
    await source.revoke("j1", ttl_s=600)  # an announcement the cache cannot hear
    assert await revocations.is_revoked("j1")
    assert not await revocations.is_revoked("j2")
    assert not await revocations.is_revoked("j2")
    assert source.reads == 7


async def test_a_read_overtaken_by_an_invalidation_is_not_cached() -> None:
    clock = Clock()
    gate = asyncio.Event()

    class SlowSource(MemoryRevocationList):
        async def is_revoked(self, jti: str) -> bool:
            answer = await super().is_revoked(jti)
            await gate.wait()  # the answer is on the wire...
            return answer

    source = SlowSource(clock=clock)
    revocations = CachedRevocationList(source, ttl_s=300, clock=clock)
    revocations.after_subscribe()
    slow = asyncio.create_task(revocations.is_revoked("j1"))
    await asyncio.sleep(0)
    await source.revoke("j1", ttl_s=600)  # ...when the revocation lands and is announced
    await revocations.invalidate("j1")
    gate.set()
    assert not await slow  # the stale answer is returned once...
    assert await revocations.is_revoked("j1")  # ...but never remembered


async def test_ttl_zero_asks_the_source_every_time() -> None:
    revocations, source, _ = cached(ttl_s=0)
    revocations.after_subscribe()
    for _ in range(3):
        assert not await revocations.is_revoked("j1")
    assert source.reads == 3


async def test_revoking_through_the_cache_takes_effect_here_at_once() -> None:
    revocations, _, _ = cached(ttl_s=300)
    revocations.after_subscribe()
    assert not await revocations.is_revoked("j1")
    await revocations.revoke("j1", ttl_s=600)
    assert await revocations.is_revoked("j1")


async def test_a_grant_whose_token_was_revoked_is_refused() -> None:
    revocations = MemoryRevocationList()
    grant = ExecutionGrant(
        invocation_id="i",
        tenant_id="t",
        agent_did="did:agent:a",
        tool_id="core__echo",
        tool_version="1.0.0",
        params_sha256="0" * 64,
        capability_jti="cap-1",
        expires_at=0,
    )
    await ensure_grant_not_revoked(revocations, grant)
    await revocations.revoke("cap-1", ttl_s=60)
    with pytest.raises(PermissionDenied, match="revoked"):
        await ensure_grant_not_revoked(revocations, grant)
