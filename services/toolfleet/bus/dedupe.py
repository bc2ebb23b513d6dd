"""Remembers which events a consumer group already processed (keyed by source + id)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

from redis.asyncio import Redis

from toolfleet.coalescing import Coalescer
from toolfleet.storage.lua import LuaScript

_MARK = LuaScript("dedupe_mark")


class ProcessedEvents(Protocol):
    async def seen(self, key: str) -> bool: ...
    async def mark(self, key: str) -> None: ...
    async def seen_all(self, keys: Sequence[str]) -> list[bool]:
        """``seen`` of each key, in one round trip."""
        ...

    async def mark_all(self, keys: Sequence[str]) -> None:
        """``mark`` of each key, in one round trip."""
        ...


_MAX_KEYS_PER_ROUND_TRIP = 4096
"""Markers one ``MGET`` or script call names at most: the calls past it wait for the next."""
_REMEMBERED_MARKERS = 4096
"""Marker names kept between a record's question and its mark (forgotten all at once
past this many): one hash a record rather than two."""


class RedisProcessedEvents:
    """``dedupe:{group}:{sha256(source, id)}`` markers with a TTL.

    Every record in flight asks once before and marks once after, alone (:meth:`seen`,
    :meth:`mark`) or with the records of its fetch (:meth:`seen_all`, :meth:`mark_all`).
    The calls made at about the same time go out together: the questions as one ``MGET``,
    the marks as one script call (``dedupe_mark.lua``, batched with the client's other
    scripts), a command per batch rather than one per record or per partition, which was
    about 17 µs of this process's CPU per record (``bench/PROFILE.md``, tenth pass).
    """

    def __init__(self, redis: Redis, *, group: str, ttl_s: int) -> None:
        self._redis = redis
        self._prefix = f"dedupe:{group}:"
        self._ttl_s = ttl_s
        self._questions: Coalescer[Sequence[str], list[bool]] = Coalescer(self._seen_markers)
        self._marks: Coalescer[Sequence[str], None] = Coalescer(self._mark_markers)
        self._named: dict[str, str] = {}

    def _key(self, key: str) -> str:
        marker = self._named.get(key)
        if marker is None:
            marker = self._prefix + hashlib.sha256(key.encode()).hexdigest()[:32]
            if len(self._named) >= _REMEMBERED_MARKERS:
                self._named.clear()
            self._named[key] = marker
        return marker

    async def seen(self, key: str) -> bool:
        return (await self._questions.submit((self._key(key),)))[0]

    async def mark(self, key: str) -> None:
        await self._marks.submit((self._key(key),))

    async def seen_all(self, keys: Sequence[str]) -> list[bool]:
        if not keys:
            return []
        return await self._questions.submit([self._key(key) for key in keys])

    async def mark_all(self, keys: Sequence[str]) -> None:
        if keys:
            await self._marks.submit([self._key(key) for key in keys])

    async def _seen_markers(self, calls: Sequence[Sequence[str]]) -> list[list[bool]]:
        calls = _leading(calls)
        replies = await self._redis.mget([marker for markers in calls for marker in markers])
        answers: list[list[bool]] = []
        at = 0
        for markers in calls:
            answers.append([reply is not None for reply in replies[at : at + len(markers)]])
            at += len(markers)
        return answers

    async def _mark_markers(self, calls: Sequence[Sequence[str]]) -> list[None]:
        calls = _leading(calls)
        await _MARK(self._redis, [marker for markers in calls for marker in markers], [self._ttl_s])
        return [None] * len(calls)


def _leading(calls: Sequence[Sequence[str]]) -> Sequence[Sequence[str]]:
    """The leading calls of a batch that name at most :data:`_MAX_KEYS_PER_ROUND_TRIP`
    markers (at least one call, however many it names)."""
    total = 0
    for i, markers in enumerate(calls):
        total += len(markers)
        if total > _MAX_KEYS_PER_ROUND_TRIP and i > 0:
            return calls[:i]
    return calls
