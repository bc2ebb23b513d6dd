"""The registry cache of policy and the validator: kept while change notices reach it.

A tool's versions are cached for minutes while the process hears the registry's change
notices, for seconds while it does not; a notice drops its tool at once, and a read
that a notice overtook is never kept. Notices come from anyone who may ``NOTIFY`` the
channel, so a flood of them costs reads again, never memory.
"""

from __future__ import annotations

import asyncio

from tests.support.agent_fixtures import manifest as support_manifest
from toolfleet.contract.manifest import ToolManifest
from toolfleet.registry.lookup import MemoryManifests, ToolLookup
from toolfleet.storage.invalidation import Generations


def manifest(tool_id: str, version: str) -> ToolManifest:
    return support_manifest(tool_id, version=version)


class CountingManifests(MemoryManifests):
    """The registry's twin, counting reads per tool."""

    def __init__(self, *manifests: ToolManifest) -> None:
        super().__init__(manifests)
        self.reads: dict[str, int] = {}

    async def versions(self, tool_id: str) -> list[ToolManifest]:
        self.reads[tool_id] = self.reads.get(tool_id, 0) + 1
        return await super().versions(tool_id)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lookup_over(source: MemoryManifests, clock: Clock) -> ToolLookup:
    return ToolLookup(source, ttl_s=5.0, pushed_ttl_s=300.0, monotonic=clock)


def hearing_notices(source: MemoryManifests, clock: Clock) -> ToolLookup:
    """:func:`lookup_over`, its change notices arriving (its listener subscribed)."""
    lookup = lookup_over(source, clock)
    lookup.after_subscribe()
    return lookup


async def test_while_notices_reach_it_versions_are_kept_for_minutes_not_seconds() -> None:
    source, clock = CountingManifests(manifest("t__a", "1.0.0")), Clock()
    lookup = hearing_notices(source, clock)
    await lookup.resolve("t__a", "^1")
    clock.now += 120  # a call two minutes later, after a quiet spell
    assert (await lookup.resolve("t__a", "^1")).manifest.version == "1.0.0"
    assert source.reads == {"t__a": 1}
    clock.now += 200  # past the pushed bound: read again
    await lookup.resolve("t__a", "^1")
    assert source.reads == {"t__a": 2}


async def test_without_notices_versions_are_kept_for_seconds() -> None:
    source, clock = CountingManifests(manifest("t__a", "1.0.0")), Clock()
    lookup = lookup_over(source, clock)  # never subscribed
    await lookup.resolve("t__a", "^1")
    clock.now += 4
    await lookup.resolve("t__a", "^1")
    assert source.reads == {"t__a": 1}
    clock.now += 2
    await lookup.resolve("t__a", "^1")
    assert source.reads == {"t__a": 2}


async def test_a_notice_drops_its_tool_and_the_next_call_sees_the_new_version() -> None:
    source, clock = CountingManifests(manifest("t__a", "1.0.0"), manifest("t__b", "1.0.0")), Clock()
    lookup = hearing_notices(source, clock)
    await lookup.resolve("t__a", "^1")
    await lookup.resolve("t__b", "^1")
    source.register(manifest("t__a", "1.1.0"))
    await lookup.invalidate("t__a")
    assert (await lookup.resolve("t__a", "^1")).manifest.version == "1.1.0"
    await lookup.resolve("t__b", "^1")
    assert source.reads == {"t__a": 2, "t__b": 1}  # the other tool stays cached


async def test_a_lost_connection_drops_everything_and_falls_back_to_seconds() -> None:
    source, clock = CountingManifests(manifest("t__a", "1.0.0")), Clock()
    lookup = hearing_notices(source, clock)
    await lookup.resolve("t__a", "^1")
    lookup.after_connection_lost()  # a change may be missed from now on
    await lookup.resolve("t__a", "^1")
    assert source.reads == {"t__a": 2}
    clock.now += 10
    await lookup.resolve("t__a", "^1")
    assert source.reads == {"t__a": 3}
    lookup.after_subscribe()  # back: what was read while deaf is dropped too
    await lookup.resolve("t__a", "^1")
    assert source.reads == {"t__a": 4}


class HeldManifests(CountingManifests):
    """Reads that wait until released: a notice can overtake one."""

    def __init__(self, *manifests: ToolManifest) -> None:
        super().__init__(*manifests)
        self.release = asyncio.Event()
        self.reading = asyncio.Event()

    async def versions(self, tool_id: str) -> list[ToolManifest]:
        found = await super().versions(tool_id)
        self.reading.set()
        await self.release.wait()
        return found


async def test_a_read_overtaken_by_a_notice_is_answered_but_never_kept() -> None:
    source, clock = HeldManifests(manifest("t__a", "1.0.0")), Clock()
    lookup = hearing_notices(source, clock)
    read = asyncio.ensure_future(lookup.resolve("t__a", "^1"))
    await source.reading.wait()
    source.register(manifest("t__a", "1.1.0"))  # committed while the read was under way
    await lookup.invalidate("t__a")
    source.release.set()
    assert (await read).manifest.version == "1.0.0"  # what it read
    assert (await lookup.resolve("t__a", "^1")).manifest.version == "1.1.0"  # not kept


async def test_a_flood_of_forged_notices_costs_reads_not_memory() -> None:
    source, clock = CountingManifests(manifest("t__a", "1.0.0")), Clock()
    lookup = hearing_notices(source, clock)
    await lookup.resolve("t__a", "^1")
    for i in range(3 * Generations.MAX_KEYS):
        await lookup.invalidate(f"forged__{i}")
    await lookup.invalidate("x" * 8000)  # longer than any notice of the trigger: ignored
    assert lookup.remembered_notices() <= Generations.MAX_KEYS
    # The cached tool was never named: still served from the cache.
    await lookup.resolve("t__a", "^1")
    assert source.reads == {"t__a": 1}


def test_generations_keep_a_read_only_while_nothing_overtook_it() -> None:
    generations = Generations()
    token = generations.token("k")
    assert generations.current("k", token)
    generations.bump("other")
    assert generations.current("k", token)
    generations.bump("k")
    assert not generations.current("k", token)
    token = generations.token("k")
    generations.bump_all()
    assert not generations.current("k", token)


def test_generations_past_their_bound_start_over_and_overtake_every_read() -> None:
    generations = Generations()
    token = generations.token("k")
    for i in range(Generations.MAX_KEYS):
        generations.bump(f"key{i}")
    assert len(generations) == Generations.MAX_KEYS
    assert generations.current("k", token)  # "k" itself never named
    generations.bump("one more")
    assert len(generations) == 1
    assert not generations.current("k", token)  # a read under "k" reads again


async def test_a_burst_of_misses_for_one_tool_reads_the_registry_once() -> None:
    source, clock = HeldManifests(manifest("t__a", "1.0.0")), Clock()
    lookup = hearing_notices(source, clock)
    burst = [asyncio.ensure_future(lookup.resolve("t__a", "^1")) for _ in range(50)]
    await source.reading.wait()
    source.release.set()
    assert {r.manifest.version for r in await asyncio.gather(*burst)} == {"1.0.0"}
    assert source.reads == {"t__a": 1}


async def test_a_miss_after_a_notice_reads_again_instead_of_joining() -> None:
    source, clock = HeldManifests(manifest("t__a", "1.0.0")), Clock()
    lookup = hearing_notices(source, clock)
    before = asyncio.ensure_future(lookup.resolve("t__a", "^1"))
    await source.reading.wait()
    source.register(manifest("t__a", "1.1.0"))
    await lookup.invalidate("t__a")
    after = asyncio.ensure_future(lookup.resolve("t__a", "^1"))
    await asyncio.sleep(0)
    source.release.set()
    assert (await before).manifest.version == "1.0.0"
    assert (await after).manifest.version == "1.1.0"
    assert source.reads == {"t__a": 2}


async def test_a_zero_ttl_turns_the_cache_off_even_while_notices_reach_it() -> None:
    source, clock = CountingManifests(manifest("t__a", "1.0.0")), Clock()
    lookup = ToolLookup(source, ttl_s=0.0, pushed_ttl_s=300.0, monotonic=clock)
    lookup.after_subscribe()
    for _ in range(3):
        await lookup.resolve("t__a", "^1")
    assert source.reads == {"t__a": 3}  # a change applies to the very next call
