"""Resolves ``tool_id`` + version range to a manifest, with a cache the registry keeps fresh.

Policy resolves every request and the validator looks up every outcome's version, so a
tool's versions are cached: for ``pushed_ttl_s`` (minutes) while the process hears the
registry's change notices (:meth:`ToolLookup.listen`: a trigger on ``tool_versions``
notifies every change, migration 0014, and each reaches :meth:`ToolLookup.invalidate`),
for ``ttl_s`` (seconds) while it does not. A call made after a pause then pays no
registry read on its critical path: on a two-core box that read cost 4-6 ms of a
worker's CPU after two seconds idle (``docs/benchmarks.md``).
Concurrent misses of one tool share one read (:class:`~toolfleet.coalescing.SingleFlight`).

Nearly every request names a tool and range resolved a moment ago, so a resolution is
remembered too: for the cached version list it was computed from (a refreshed list
starts over), and only until the next deprecation or sunset date of any of its
versions, the one instant at which the same list can resolve differently.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Protocol

import semver

from toolfleet.coalescing import SingleFlight
from toolfleet.contract.manifest import ToolManifest
from toolfleet.errors import ToolNotFound
from toolfleet.registry.versions import VersionInfo, resolve
from toolfleet.storage.invalidation import Generations, run_postgres_invalidation_listener


class ManifestSource(Protocol):
    async def versions(self, tool_id: str) -> list[ToolManifest]:
        """Every registered version of ``tool_id``, newest first; empty if unknown."""
        ...


class MemoryManifests:
    """:class:`~toolfleet.registry.store.RegistryStore`'s twin as a :class:`ManifestSource`."""

    def __init__(self, manifests: Iterable[ToolManifest] = ()) -> None:
        self._versions: dict[str, dict[str, ToolManifest]] = {}
        for manifest in manifests:
            self.register(manifest)

    def register(self, manifest: ToolManifest) -> None:
        """Add ``manifest``, or replace the stored one of the same id and version."""
        self._versions.setdefault(manifest.tool_id, {})[manifest.version] = manifest

    async def versions(self, tool_id: str) -> list[ToolManifest]:
        found = self._versions.get(tool_id, {}).values()
        return sorted(found, key=_newest_first)


def _newest_first(manifest: ToolManifest) -> tuple[int, int, int]:
    """Sort key: by major, minor, patch, descending, as the store orders its rows."""
    v = semver.Version.parse(manifest.version)
    return (-v.major, -v.minor, -v.patch)


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedTool:
    manifest: ToolManifest
    warnings: list[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class _Resolution:
    """A remembered resolution and what it holds for."""

    versions: list[ToolManifest]
    """The cached version list it was computed from (by identity)."""
    until: datetime | None
    """The next lifecycle date of any version; ``None``: no date ahead."""
    manifest: ToolManifest
    warnings: tuple[str, ...]


MAX_RESOLUTIONS = 10_000
"""Resolutions a lookup remembers (cleared when exceeded)."""

PUSHED_TTL_S = 300.0
"""How long a tool's versions are kept while change notices reach the process. Only a
notice lost without the listener knowing (its connection's line check is due) leaves
an entry stale, and then for this long at most."""


VERSIONS_CHANGED: Final = "tool_versions_changed"
"""The ``NOTIFY`` channel of every change of ``tool_versions`` (migration 0014's trigger);
each payload is a tool id."""

MAX_NOTICE_CHARS = 1000
"""The longest tool id a change notice names (migration 0014 cuts the payload there)."""


class ToolLookup:
    """Version resolution over the registry; versions cached (see the module).

    Args:
        ttl_s: how long versions are kept while no change notice can reach the process;
            0 turns the cache off (every call reads the registry, notices or not).
        pushed_ttl_s: how long while they can (:data:`PUSHED_TTL_S`).
        monotonic: the clock of the cache's ages (tests move it).
    """

    def __init__(
        self,
        source: ManifestSource,
        *,
        ttl_s: float = 5.0,
        pushed_ttl_s: float = PUSHED_TTL_S,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._source = source
        self._ttl_s = ttl_s
        self._pushed_ttl_s = pushed_ttl_s
        self._pushed = False
        self._clock = clock
        self._monotonic = monotonic
        self._cache: dict[str, tuple[float, list[ToolManifest]]] = {}
        self._generations = Generations()
        self._reads: SingleFlight[str, tuple[int, int], list[ToolManifest]] = SingleFlight()
        self._resolved: dict[tuple[str, str, frozenset[str]], _Resolution] = {}

    async def versions(self, tool_id: str) -> list[ToolManifest]:
        now = self._monotonic()
        hit = self._cache.get(tool_id)
        # 0 turns the cache off, notices or not: every call reads the registry.
        ttl_s = self._pushed_ttl_s if self._pushed and self._ttl_s > 0 else self._ttl_s
        if hit is not None and now - hit[0] < ttl_s:
            return hit[1]
        token = self._generations.token(tool_id)
        return await self._reads.run(tool_id, token, lambda: self._read(tool_id, token, now))

    async def _read(self, tool_id: str, token: tuple[int, int], now: float) -> list[ToolManifest]:
        found = await self._source.versions(tool_id)
        # An unknown tool is not cached: it may be registered any moment. Nor is a list
        # read while a change notice of the tool came: it may predate the change.
        if found and self._generations.current(tool_id, token):
            self._cache[tool_id] = (now, found)
        return found

    # --- change notices (an InvalidationTarget) ------------------------------------

    async def listen(
        self,
        dsn: str,
        stop: asyncio.Event,
        *,
        subscribed: asyncio.Event | None = None,
        max_backoff_s: float = 5.0,
    ) -> None:
        """Hear the registry's change notices (:data:`VERSIONS_CHANGED`) until ``stop``,
        reconnecting when Postgres goes away; ``subscribed`` is set while they arrive."""
        await run_postgres_invalidation_listener(
            dsn, VERSIONS_CHANGED, self, stop, subscribed=subscribed, max_backoff_s=max_backoff_s
        )

    def after_subscribe(self) -> None:
        """Notices reach this process from now on: cache for ``pushed_ttl_s``, after
        dropping what was read while none could (a change may have been missed)."""
        self._forget_all()
        self._pushed = True

    def after_connection_lost(self) -> None:
        """Notices may be missed from now on: drop everything, cache for ``ttl_s``."""
        self._forget_all()
        self._pushed = False

    async def invalidate(self, key: str) -> None:
        """A version of tool ``key`` was registered, changed or deleted.

        Anyone who may connect to the database can ``NOTIFY`` the channel: a notice is
        only ever a reason to read again, and one longer than any tool id (the trigger
        cuts at 1,000 characters) names nothing here and is dropped."""
        if len(key) > MAX_NOTICE_CHARS:
            return
        self._generations.bump(key)
        self._cache.pop(key, None)

    def remembered_notices(self) -> int:
        """Tools whose notices are remembered (bounded: :class:`Generations`)."""
        return len(self._generations)

    def _forget_all(self) -> None:
        self._generations.bump_all()
        self._cache.clear()

    async def resolve(
        self, tool_id: str, spec: str, *, pinned: frozenset[str] = frozenset()
    ) -> ResolvedTool:
        """The version ``spec`` names; sunset versions only if in ``pinned`` (see
        :func:`~toolfleet.registry.versions.resolve`)."""
        manifests = await self.versions(tool_id)
        if not manifests:
            raise ToolNotFound(
                f"no tool named {tool_id!r} is registered", details={"tool_id": tool_id}
            )
        now = self._clock()
        key = (tool_id, spec, pinned)
        hit = self._resolved.get(key)
        if hit is not None and hit.versions is manifests and (hit.until is None or now < hit.until):
            return ResolvedTool(manifest=hit.manifest, warnings=list(hit.warnings))
        resolution = resolve(
            tool_id,
            spec,
            [
                VersionInfo(
                    version=m.version,
                    state=m.lifecycle_state,
                    deprecation_message=m.deprecation_message,
                    deprecation_date=m.deprecation_date,
                    sunset_date=m.sunset_date,
                    deprecated_in_favor_of=m.deprecated_in_favor_of,
                )
                for m in manifests
            ],
            now=now,
            pinned=pinned,
        )
        manifest = next(m for m in manifests if m.version == resolution.version)
        if len(self._resolved) >= MAX_RESOLUTIONS:
            self._resolved.clear()
        self._resolved[key] = _Resolution(
            versions=manifests,
            until=_next_date(manifests, now),
            manifest=manifest,
            warnings=tuple(resolution.warnings),
        )
        return ResolvedTool(manifest=manifest, warnings=resolution.warnings)

    async def exact(self, tool_id: str, version: str) -> ToolManifest:
        for manifest in await self.versions(tool_id):
            if manifest.version == version:
                return manifest
        self._cache.pop(tool_id, None)
        for manifest in await self.versions(tool_id):
            if manifest.version == version:
                return manifest
        raise ToolNotFound(f"{tool_id}@{version} is not registered", details={"tool_id": tool_id})


def _next_date(manifests: Iterable[ToolManifest], now: datetime) -> datetime | None:
    """The first deprecation or sunset date after ``now``: until then, every version's
    effective state (:func:`~toolfleet.contract.manifest.effective_state`) stays put.

    ``now`` itself (nothing is reused) when a date cannot be compared with ``now``."""
    try:
        ahead = [
            when
            for m in manifests
            for when in (m.deprecation_date, m.sunset_date)
            if when is not None and when > now
        ]
    except TypeError:  # a naive date against an aware clock
        return now
    return min(ahead, default=None)
