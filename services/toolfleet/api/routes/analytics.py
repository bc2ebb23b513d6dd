"""``/v1/analytics``: the stream analytics tables, per tenant, as the analytics app last
wrote them (``toolfleet worker analytics``; the API only reads its snapshots).

A caller sees its own tenant; an admin sees every tenant. Another tenant answers 404,
like an unknown one. A tenant the app has not seen yet answers an empty snapshot.

``GET /v1/analytics/tenants/{tenant}/events`` is the same snapshot, live (Server-Sent
Events): the app names each tenant it writes on a Redis channel, and the API pushes
that tenant's new snapshot to its followers, without polling.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from redis.asyncio import Redis
from redis.exceptions import RedisError

from toolfleet.analytics.snapshot import CHANGES, RedisSnapshots, TenantSnapshot
from toolfleet.api.auth import CallerDep
from toolfleet.api.credential import CredentialWatch, until_credential_ends
from toolfleet.api.problems import ProblemError, problem_responses
from toolfleet.api.resources import ApiResources, resources
from toolfleet.api.responses import EVENT_STREAM, KEEPALIVE, KEEPALIVE_S, sse_frame
from toolfleet.events.models import TENANT_ID_PATTERN
from toolfleet.storage.pubsub import listen_with_reconnect

router = APIRouter(prefix="/v1/analytics", tags=["analytics"], responses=problem_responses(401))

ResourcesDep = Annotated[ApiResources, Depends(resources)]


class AnalyticsTenants(BaseModel):
    """Tenants with analytics the caller may read."""

    tenants: list[str]


@router.get("/tenants", response_model=AnalyticsTenants)
async def list_tenants(res: ResourcesDep, caller: CallerDep) -> AnalyticsTenants:
    """Tenants the analytics app has seen: all for an admin, else the caller's own."""
    seen = await RedisSnapshots(res.redis).tenants()
    return AnalyticsTenants(tenants=[t for t in seen if caller.may_see(t)])


@router.get(
    "/tenants/{tenant_id}",
    response_model=TenantSnapshot,
    responses=problem_responses(404, 422),
)
async def tenant_analytics(
    tenant_id: Annotated[str, Path(pattern=TENANT_ID_PATTERN, max_length=128)],
    res: ResourcesDep,
    caller: CallerDep,
) -> TenantSnapshot:
    """The tenant's newest 1 minute windows, its 1 hour window and recent anomalies."""
    if not caller.may_see(tenant_id):
        raise ProblemError(404, f"no analytics for tenant {tenant_id!r}")
    snapshot = await RedisSnapshots(res.redis).read(tenant_id)
    return snapshot or TenantSnapshot(tenant_id=tenant_id)


@dataclass(eq=False)
class _Follower:
    tenant_id: str
    changed: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class SnapshotChanges:
    """One Redis subscription to :data:`CHANGES` per API process, however many consoles
    follow, fanned out to the followers of each tenant (a pub/sub connection per stream
    would take the pool's connections from everything else). It runs while anyone
    follows, and reconnects with backoff; each time it (re)subscribes, every follower
    reads its snapshot again (a write may have gone by unheard)."""

    redis: Redis
    _followers: set[_Follower] = field(default_factory=set)
    _stop: asyncio.Event | None = None
    _task: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def follow(self, tenant_id: str) -> AsyncIterator[_Follower]:
        follower = _Follower(tenant_id)
        self._followers.add(follower)
        if self._stop is None:
            self._stop = asyncio.Event()
            self._task = asyncio.create_task(self._listen(self._stop))
        try:
            yield follower
        finally:
            self._followers.discard(follower)
            if not self._followers and self._stop is not None:
                self._stop.set()
                self._stop = None

    def _wake(self, tenant_id: str | None) -> None:
        for follower in list(self._followers):
            if tenant_id is None or follower.tenant_id == tenant_id:
                follower.changed.set()

    async def _listen(self, stop: asyncio.Event) -> None:
        async def on_message(tenant_id: str) -> None:
            self._wake(tenant_id)

        await listen_with_reconnect(
            self.redis, CHANGES, on_message, stop, after_subscribe=lambda: self._wake(None)
        )


def _changes(request: Request, res: ApiResources) -> SnapshotChanges:
    changes = getattr(request.app.state, "analytics_changes", None)
    if not isinstance(changes, SnapshotChanges) or changes.redis is not res.redis:
        changes = SnapshotChanges(res.redis)
        request.app.state.analytics_changes = changes
    return changes


def _snapshot_frame(number: int, snapshot: TenantSnapshot) -> str:
    return sse_frame(number, "snapshot", snapshot.model_dump_json())


async def follow_snapshots(
    follower: _Follower,
    read: Callable[[], Awaitable[TenantSnapshot]],
    *,
    keepalive_s: float = KEEPALIVE_S,
) -> AsyncIterator[str]:
    """SSE frames: the snapshot now, then each one the analytics app writes (the same
    one twice is sent once)."""
    number, last = 1, await read()
    yield _snapshot_frame(number, last)
    while True:
        try:
            await asyncio.wait_for(follower.changed.wait(), keepalive_s)
        except TimeoutError:
            yield KEEPALIVE
            continue
        follower.changed.clear()
        now = await read()
        if now != last:
            number, last = number + 1, now
            yield _snapshot_frame(number, now)


@router.get(
    "/tenants/{tenant_id}/events",
    response_class=StreamingResponse,
    responses={
        **EVENT_STREAM,
        **problem_responses(404, 422),
    },
)
async def tenant_analytics_events(
    tenant_id: Annotated[str, Path(pattern=TENANT_ID_PATTERN, max_length=128)],
    request: Request,
    res: ResourcesDep,
    caller: CallerDep,
) -> StreamingResponse:
    """The tenant's analytics, live: a ``snapshot`` event now (the body of
    ``GET /v1/analytics/tenants/{tenant_id}``), then one each time the analytics app
    writes a new one, until the token is revoked or expires (``stream_closed``)."""
    if not caller.may_see(tenant_id):
        raise ProblemError(404, f"no analytics for tenant {tenant_id!r}")
    store = RedisSnapshots(res.redis)
    changes = _changes(request, res)

    async def read() -> TenantSnapshot:
        return await store.read(tenant_id) or TenantSnapshot(tenant_id=tenant_id)

    async def frames() -> AsyncIterator[str]:
        # Following before the first read: no write falls between the two.
        async with changes.follow(tenant_id) as follower:
            try:
                async for frame in follow_snapshots(follower, read):
                    yield frame
            except (RedisError, OSError):
                return  # the console reconnects

    watch = CredentialWatch(revocations=res.revocations)
    return StreamingResponse(
        until_credential_ends(frames(), lambda: watch.ended(caller.capability)),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
