"""The one way toolfleet runs Lua on Redis: by SHA1 (``EVALSHA``), in full on NOSCRIPT.

A script is either a file of this package's ``scripts/`` folder (``LuaScript("ratelimit")``
loads ``storage/scripts/ratelimit.lua``) or source given inline, for the short scripts
that are built from a shared prelude (the lease fence check). Every multi-key step of
every service runs as one script, so concurrent replicas see it as atomic.

:class:`CoalescedScripts` sends the script calls that many tasks make at about the same
time (the executor's leases of the records of one fetch) in one pipelined round trip;
each script is still atomic on its own, and each caller gets its own reply or error.
Calling a :class:`LuaScript` goes through the client's own :class:`CoalescedScripts`, so
every script of every service is batched this way (a round trip per call was 9% of
policy's CPU, ``bench/PROFILE.md``); an idle process still makes one round trip.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from importlib import resources
from typing import Any, cast

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from toolfleet.coalescing import Coalescer

_Call = tuple["LuaScript", tuple[str, ...], tuple[str | int | float, ...]]

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
        scripts = _BY_CLIENT.get(redis)
        if scripts is None:
            # A proxy: the batcher, a value of the weak map, must not keep its key alive.
            scripts = _BY_CLIENT[redis] = CoalescedScripts(cast(Redis, weakref.proxy(redis)))
        return await scripts.run(self, keys, args)


class CoalescedScripts:
    """Script calls made at about the same time, sent as one pipeline (not a transaction)."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._batches: Coalescer[_Call, Any] = Coalescer(self._send)

    async def run(
        self, script: LuaScript, keys: Sequence[str], args: Sequence[str | int | float]
    ) -> Any:
        """Run ``script`` in the next batch; its reply, or the error it raised."""
        return await self._batches.submit((script, tuple(keys), tuple(args)))

    async def _send(self, calls: Sequence[_Call]) -> list[Any]:
        pipe = self._redis.pipeline(transaction=False)
        for script, keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        missing = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:  # a server that lost its script cache: EVAL caches them again
            pipe = self._redis.pipeline(transaction=False)
            for i in missing:
                script, keys, args = calls[i]
                pipe.eval(script.source, len(keys), *keys, *args)
            for i, reply in zip(missing, await pipe.execute(raise_on_error=False), strict=True):
                replies[i] = reply
        return replies


#: One batcher per client: a client lives on one event loop, and so does its batcher.
_BY_CLIENT: weakref.WeakKeyDictionary[Redis, CoalescedScripts] = weakref.WeakKeyDictionary()
