"""The clients the API holds for its lifetime, built at start-up and closed at shutdown."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import asyncpg
from fastapi import Request
from redis.asyncio import Redis

from toolfleet.api.feed import InvocationFeed
from toolfleet.api.queries import InvocationQueries
from toolfleet.api.settings import ApiSettings
from toolfleet.auth.grants import fleet_grant_keys
from toolfleet.auth.tokens import TokenVerifier
from toolfleet.client.publisher import KafkaPublisher
from toolfleet.errors import ToolfleetError
from toolfleet.events.types import Source
from toolfleet.registry.store import RegistryStore
from toolfleet.storage.accepted import AcceptedCalls, RedisAcceptedCalls
from toolfleet.storage.blobs import PostgresBlobStore
from toolfleet.storage.notices import RedisFinishedNotices
from toolfleet.storage.postgres import create_pool
from toolfleet.storage.redis import connect_redis
from toolfleet.storage.revocation import CachedRevocationList


@dataclass(frozen=True, kw_only=True)
class ApiResources:
    """Everything a request handler may use; one instance per running app."""

    settings: ApiSettings
    pool: asyncpg.Pool
    redis: Redis
    client: KafkaPublisher
    verifier: TokenVerifier
    revocations: CachedRevocationList
    """Checked on every authenticated request; follows ``token:revocations``."""
    registry: RegistryStore
    invocations: InvocationQueries
    blobs: PostgresBlobStore
    notices: RedisFinishedNotices
    """Wakes synchronous invokes when status has stored their outcome."""
    feed: InvocationFeed
    """Pushes changed invocations to the console's live list."""
    accepted: AcceptedCalls
    """The calls this API accepted a moment ago: a read of one awaits its row."""


def load_verifier(settings: ApiSettings) -> TokenVerifier:
    """The token verifier of the configured keys (JWKS file or URL, else the PEM file).

    The API cannot run without one. Keys are loaded on first use and refreshed on an
    unknown ``kid``, so a key rotation needs no restart.
    """
    path = settings.jwt_public_key_file
    if path is not None and not path.is_file():
        raise ToolfleetError(f"TOOLFLEET_JWT_PUBLIC_KEY_FILE names a missing file: {path}")
    verifier = TokenVerifier.from_settings(settings)
    if verifier is None:
        raise ToolfleetError(
            "no token verification key is configured (TOOLFLEET_JWKS_FILE, TOOLFLEET_JWKS_URL "
            "or TOOLFLEET_JWT_PUBLIC_KEY_FILE): the API cannot verify bearer tokens"
        )
    return verifier


def require_grant_key(settings: ApiSettings) -> None:
    """Refuse to serve without the fleet's grant key.

    The API signs every approval, denial and cancel with it, and policy refuses
    unsigned control events: an API without the key would answer 200 to decisions
    that never take effect. Raises :class:`~toolfleet.auth.grants.GrantKeyError`
    (one line saying how to create the key).
    """
    fleet_grant_keys(settings)


#: How long start-up waits for the "invocation finished" subscription.
_SUBSCRIBE_WAIT_S = 5.0


@asynccontextmanager
async def open_resources(settings: ApiSettings) -> AsyncIterator[ApiResources]:
    """Build every client; close them all on exit, whatever failed on the way."""
    verifier = load_verifier(settings)
    require_grant_key(settings)
    async with AsyncExitStack() as stack:
        pool = await create_pool(settings.database_url, min_size=1, max_size=10)
        stack.push_async_callback(pool.close)
        redis = connect_redis(settings.redis_url)
        stack.push_async_callback(redis.aclose)
        client = await stack.enter_async_context(
            KafkaPublisher(settings, source=Source.API, watch=False)
        )
        revocations = CachedRevocationList.from_settings(redis, settings)
        stop = asyncio.Event()
        listener = asyncio.create_task(revocations.listen(redis, stop))
        stack.push_async_callback(_stop_job, stop, listener)
        notices = RedisFinishedNotices(redis)
        subscribed = asyncio.Event()
        notice_listener = asyncio.create_task(notices.listen(stop, subscribed=subscribed.set))
        stack.push_async_callback(_stop_job, stop, notice_listener)
        # Serve without the subscription if Redis is slow: a synchronous invoke then
        # finds its outcome by rechecking.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(subscribed.wait(), _SUBSCRIBE_WAIT_S)
        registry = RegistryStore(pool)
        await registry.detect_pgvector()  # logged: how tool search ranks
        invocations = InvocationQueries(pool)
        feed = InvocationFeed(read_many=invocations.many)
        for job in (feed.listen(settings.database_url, stop), feed.run(stop)):
            stack.push_async_callback(_stop_job, stop, asyncio.create_task(job))
        yield ApiResources(
            settings=settings,
            pool=pool,
            redis=redis,
            client=client,
            verifier=verifier,
            revocations=revocations,
            registry=registry,
            invocations=invocations,
            blobs=PostgresBlobStore(pool),
            notices=notices,
            feed=feed,
            accepted=RedisAcceptedCalls(redis),
        )


async def _stop_job(stop: asyncio.Event, job: asyncio.Task[None]) -> None:
    stop.set()
    await asyncio.gather(job, return_exceptions=True)


def resources(request: Request) -> ApiResources:
    """FastAPI dependency: the running app's resources."""
    res = request.app.state.resources
    if not isinstance(res, ApiResources):  # pragma: no cover - lifespan did not run
        raise RuntimeError("the API's lifespan has not started")
    return res
