"""Resolves ``tool_id`` + version range to a manifest, with a short-lived cache.

Policy resolves every request, and nearly every request names a tool and range it
resolved a moment ago, so a resolution is remembered too: for the cached version list
it was computed from (a refreshed list starts over), and only until the next
deprecation or sunset date of any of its versions, the one instant at which the same
list can resolve differently.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

import semver

from toolfleet.contract.manifest import ToolManifest
from toolfleet.errors import ToolNotFound
from toolfleet.registry.versions import VersionInfo, resolve


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


class ToolLookup:
    """Version resolution over the registry; versions are cached for ``ttl_s`` seconds."""

    def __init__(
        self,
        source: ManifestSource,
        *,
        ttl_s: float = 5.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._source = source
        self._ttl_s = ttl_s
        self._clock = clock
        self._cache: dict[str, tuple[float, list[ToolManifest]]] = {}
        self._resolved: dict[tuple[str, str, frozenset[str]], _Resolution] = {}

    async def versions(self, tool_id: str) -> list[ToolManifest]:
        now = time.monotonic()
        hit = self._cache.get(tool_id)
        if hit is not None and now - hit[0] < self._ttl_s:
            return hit[1]
        found = await self._source.versions(tool_id)
        if found:  # an unknown tool is not cached: it may be registered any moment
            self._cache[tool_id] = (now, found)
        return found

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
