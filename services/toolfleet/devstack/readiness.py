"""When is a dev fleet up, and what to tell the user then."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import httpx

from toolfleet.devstack.console import DevConsole
from toolfleet.devstack.processes import SupervisedProcess


async def wait_until_up(
    readiness_url: str,
    processes: Sequence[SupervisedProcess],
    stop: asyncio.Event,
    console: DevConsole,
    *,
    interval_s: float = 0.25,
    report_every_s: float = 20.0,
) -> bool:
    """Wait until ``/readyz`` answers 200 and every service runs; False if ``stop`` came first.

    Says what it is still waiting for every ``report_every_s`` seconds.
    """
    loop = asyncio.get_running_loop()
    last_report = loop.time()
    # trust_env=False: an HTTP(S)_PROXY in the environment must not intercept localhost.
    async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
        while not stop.is_set():
            try:
                answer = await client.get(readiness_url)
                waiting = "" if answer.status_code == 200 else f"/readyz says {answer.status_code}"
            except httpx.HTTPError as exc:
                waiting = f"the API does not answer yet ({type(exc).__name__})"
            down = [p.name for p in processes if not p.running]
            if not waiting and not down:
                return True
            if loop.time() - last_report >= report_every_s:
                last_report = loop.time()
                console.say("still starting: " + (waiting or "waiting for " + ", ".join(down)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)
    return False
