"""Long responses end with their token: the watch, the SSE wrapper, the call race, and
the catalog's intersection with the token's ``tool_id`` claim (in-memory twins)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable
from typing import Any

from toolfleet.api.credential import (
    STREAM_CLOSED,
    CloseReason,
    CredentialWatch,
    before_credential_ends,
    until_credential_ends,
)
from toolfleet.auth.tokens import Capability
from toolfleet.policy.catalog import CatalogView, visible_page
from toolfleet.policy.documents import TenantPolicy
from toolfleet.storage.revocation import CachedRevocationList, MemoryRevocationList


def capability(*, expires_at: float, jti: str = "jti-1") -> Capability:
    return Capability(
        tenant_id="t1",
        agent_did="did:agent:a",
        tool_id="*",
        tool_version="*",
        jti=jti,
        subject="did:agent:a",
        scopes=frozenset(),
        expires_at=int(expires_at),
    )


def live_list() -> CachedRevocationList:
    cached = CachedRevocationList(MemoryRevocationList(), ttl_s=300)
    cached.after_subscribe()  # as the listener does once subscribed
    return cached


def moving_clock(start: float) -> Callable[[], float]:
    """Epoch-like seconds that advance with the event loop, from ``start``."""
    loop = asyncio.get_running_loop()
    origin = loop.time()
    return lambda: start + loop.time() - origin


async def test_a_pushed_revocation_ends_the_watch_at_once() -> None:
    revocations = live_list()
    watch = CredentialWatch(revocations=revocations, recheck_s=60, offline_recheck_s=60)
    ended = asyncio.create_task(watch.ended(capability(expires_at=4e9)))
    await asyncio.sleep(0)  # let it start watching
    assert not ended.done()
    assert await revocations.is_revoked("jti-1") is False  # cached as "not revoked"

    await revocations.revoke("jti-1", ttl_s=60)

    # Long recheck intervals: only the announcement can have woken it.
    assert await asyncio.wait_for(ended, 1.0) is CloseReason.TOKEN_REVOKED


async def test_the_watch_ends_at_the_tokens_expiry_on_the_injected_clock() -> None:
    clock = moving_clock(1_000_000.0)
    watch = CredentialWatch(revocations=live_list(), clock=clock, recheck_s=60)
    token = capability(expires_at=1_000_001.0)  # one second from "now"

    reason = await asyncio.wait_for(watch.ended(token), 3.0)

    assert reason is CloseReason.TOKEN_EXPIRED
    assert clock() >= token.expires_at


async def test_an_already_expired_token_ends_at_once() -> None:
    watch = CredentialWatch(revocations=live_list(), clock=lambda: 2_000.0)
    assert await watch.ended(capability(expires_at=1_999)) is CloseReason.TOKEN_EXPIRED


async def test_without_a_subscription_the_watch_polls_the_list() -> None:
    source = MemoryRevocationList()
    cached = CachedRevocationList(source)  # never subscribed: not live
    watch = CredentialWatch(revocations=cached, recheck_s=60, offline_recheck_s=0.05)
    ended = asyncio.create_task(watch.ended(capability(expires_at=4e9)))
    await asyncio.sleep(0)
    await source.revoke("jti-1", ttl_s=60)  # straight to the source: nothing announced
    assert await asyncio.wait_for(ended, 1.0) is CloseReason.TOKEN_REVOKED


async def test_a_stream_sends_stream_closed_last_then_stops() -> None:
    released: list[str] = []
    more = asyncio.Queue[str]()

    async def frames() -> AsyncGenerator[str, None]:
        try:
            yield "event: snapshot\ndata: {}\n\n"
            while True:
                yield await more.get()
        finally:
            released.append("frames")

    end = asyncio.Event()

    async def ended() -> CloseReason:
        await end.wait()
        return CloseReason.TOKEN_REVOKED

    stream = until_credential_ends(frames(), ended)
    assert (await anext(stream)).startswith("event: snapshot")
    more.put_nowait("event: invocation\ndata: {}\n\n")
    assert (await anext(stream)).startswith("event: invocation")
    end.set()
    last = await anext(stream)
    assert last.startswith(f"event: {STREAM_CLOSED}\n")
    data: dict[str, Any] = json.loads(last.split("data: ", 1)[1])
    assert data["reason"] == "token_revoked"
    more.put_nowait("event: invocation\ndata: {}\n\n")  # too late: never sent
    assert [frame async for frame in stream] == []
    assert released == ["frames"]


async def test_a_stream_that_ends_on_its_own_stops_the_watch() -> None:
    watching = asyncio.Event()
    stopped = asyncio.Event()

    async def frames() -> AsyncGenerator[str, None]:
        await watching.wait()
        yield "event: tool_call_result\ndata: {}\n\n"

    async def ended() -> CloseReason:
        watching.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()
        raise AssertionError("unreachable")

    got = [frame async for frame in until_credential_ends(frames(), ended)]
    assert len(got) == 1
    assert "tool_call_result" in got[0]
    assert stopped.is_set()


async def test_a_call_answers_the_reason_when_its_token_ends_first() -> None:
    cancelled = asyncio.Event()

    async def work() -> str:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
        return "never"

    async def ended() -> CloseReason:
        return CloseReason.TOKEN_EXPIRED

    assert await before_credential_ends(work(), ended()) is CloseReason.TOKEN_EXPIRED
    assert cancelled.is_set()

    async def quick() -> str:
        return "done"

    async def never() -> CloseReason:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    assert await before_credential_ends(quick(), never()) == "done"


async def test_the_catalog_is_the_policy_and_the_tokens_claim() -> None:
    registry = [{"tool_id": t} for t in ("core__echo", "core__sleep", "core__wc", "test__x")]

    async def fetch(limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
        return registry[offset : offset + limit], len(registry)

    policy = TenantPolicy(allow_tools=["core__*"])
    narrow = CatalogView(policy=policy, granted="core__echo")
    rows, total = await visible_page(narrow, fetch, offset=0, limit=50)
    assert ([r["tool_id"] for r in rows], total) == (["core__echo"], 1)
    assert not narrow.shows("core__sleep")

    globbed = CatalogView(policy=policy, granted="core__[ew]*")
    rows, _ = await visible_page(globbed, fetch, offset=0, limit=50)
    assert [r["tool_id"] for r in rows] == ["core__echo", "core__wc"]

    admin = CatalogView(policy=None, everything=True, granted="test__*")
    rows, total = await visible_page(admin, fetch, offset=0, limit=50)
    assert ([r["tool_id"] for r in rows], total) == (["test__x"], 1)
