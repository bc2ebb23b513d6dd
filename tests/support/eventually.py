"""Poll for an effect instead of sleeping for it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    fn: Callable[[], Awaitable[T | None]], *, timeout: float = 20.0, interval: float = 0.05
) -> T:
    """Call ``fn`` until it returns something truthy (and return it) or time runs out.

    Assertion errors inside ``fn`` count as "not yet"; the last one is re-raised.
    """
    deadline = time.monotonic() + timeout
    last_error: AssertionError | None = None
    while True:
        try:
            result = await fn()
            if result:
                return result
        except AssertionError as exc:
            last_error = exc
        if time.monotonic() > deadline:
            if last_error is not None:
                raise last_error
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)
