"""The one way toolfleet runs Lua on Redis: by SHA1 (``EVALSHA``), in full on NOSCRIPT.

A script is either a file of this package's ``scripts/`` folder (``LuaScript("ratelimit")``
loads ``storage/scripts/ratelimit.lua``) or source given inline, for the short scripts
that are built from a shared prelude (the lease fence check). Every multi-key step of
every service runs as one script, so concurrent replicas see it as atomic.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

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
        """Run the script; ``EVAL`` (which also caches it) when the server lacks it."""
        try:
            return await redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await redis.eval(self.source, len(keys), *keys, *args)
