"""The one way toolfleet runs Lua on Redis: by SHA1 (``EVALSHA``), in full on NOSCRIPT.

A script is either a file of this package's ``scripts/`` folder (``LuaScript("ratelimit")``
loads ``storage/scripts/ratelimit.lua``) or source given inline, for the short scripts
that are built from a shared prelude (the lease fence check). Every multi-key step of
every service runs as one script, so concurrent replicas see it as atomic.

Script calls that many tasks make at about the same time (the executor's leases of the
records of one fetch) go out in one pipelined round trip, with the process's other
Redis commands (:class:`~toolfleet.storage.redis.RedisBatches`); each script is still
atomic on its own, and each caller gets its own reply or error. Calling a
:class:`LuaScript` goes through its client's batcher, so every script of every service
is batched this way (a round trip per call was 9% of policy's CPU, ``bench/PROFILE.md``);
an idle process still makes one round trip.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.asyncio import Redis

from toolfleet.storage.redis import Command, batches_of

__all__ = ["CoalescedScripts", "LuaScript"]


class LuaScript:
    """A script sent by SHA1 and re-sent in full only when the server lacks it."""

    def __init__(self, name: str, *, source: str | None = None) -> None:
        """Load ``scripts/{name}.lua`` from this package (or use ``source`` as given)."""
        self.name = name
        self.source = (
            source
            if source is not None
            else resources.files(__package__).joinpath("scripts", f"{name}.lua").read_text("utf-8")
        )
        self.sha = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()

    async def __call__(
        self, redis: Redis, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        """Run the script in the client's next pipeline (see :class:`CoalescedScripts`);
        ``EVAL`` (which also caches it) when the server lacks it."""
        call, resend = self._calls(keys, args)
        return await batches_of(redis).run(call, on_noscript=resend)

    def _calls(
        self, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> tuple[Command, Command]:
        """``EVALSHA`` with ``keys`` and ``args``, and the ``EVAL`` to send instead."""
        return (
            lambda pipe: pipe.evalsha(self.sha, len(keys), *keys, *args),
            lambda pipe: pipe.eval(self.source, len(keys), *keys, *args),
        )


class CoalescedScripts:
    """A store's handle on its client's :class:`~toolfleet.storage.redis.RedisBatches`
    for script calls: those made at about the same time go out as one pipeline (not a
    transaction), with the other commands of the process."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def run(
        self, script: LuaScript, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        """Run ``script`` in the next batch; its reply, or the error it raised."""
        return await script(self._redis, keys, args)
