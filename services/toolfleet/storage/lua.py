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

from toolfleet.storage.redis import batches_of

__all__ = ["LuaScript"]


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
        """Run the script in the client's next pipeline (see
        :class:`~toolfleet.storage.redis.RedisBatches`);
        ``EVAL`` (which also caches it) when the server lacks it."""
        return await batches_of(redis).run(
            lambda pipe: pipe.evalsha(self.sha, len(keys), *keys, *args),
            on_noscript=lambda pipe: pipe.eval(self.source, len(keys), *keys, *args),
        )
