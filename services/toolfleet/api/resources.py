"""The clients the API holds for its lifetime, built at start-up and closed at shutdown."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import asyncpg
from fastapi import Request
from redis.asyncio import Redis

from toolfleet.api.queries import InvocationQueries
from toolfleet.api.settings import ApiSettings
from toolfleet.auth.tokens import TokenVerifier
from toolfleet.errors import ToolfleetError
from toolfleet.events.types import Source
from toolfleet.registry.store import RegistryStore
from toolfleet.sdk.client import ToolfleetClient
from toolfleet.storage.blobs import PostgresBlobStore
from toolfleet.storage.postgres import create_pool
from toolfleet.storage.redis import connect_redis


@dataclass(frozen=True, kw_only=True)
class ApiResources:
    """Everything a request handler may use; one instance per running app."""

    settings: ApiSettings
    pool: asyncpg.Pool
    redis: Redis
    client: ToolfleetClient
    verifier: TokenVerifier
    registry: RegistryStore
    invocations: InvocationQueries
    blobs: PostgresBlobStore


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


@asynccontextmanager
async def open_resources(settings: ApiSettings) -> AsyncIterator[ApiResources]:
    """Build every client; close them all on exit, whatever failed on the way."""
    verifier = load_verifier(settings)
    async with AsyncExitStack() as stack:
        pool = await create_pool(settings.database_url, min_size=1, max_size=10)
        stack.push_async_callback(pool.close)
        redis = connect_redis(settings.redis_url)
        stack.push_async_callback(redis.aclose)
        client = ToolfleetClient(settings, source=Source.API, watch=False)
        stack.push_async_callback(client.stop)  # also releases a half-started client
        await client.start()
        yield ApiResources(
            settings=settings,
            pool=pool,
            redis=redis,
            client=client,
            verifier=verifier,
            registry=RegistryStore(pool),
            invocations=InvocationQueries(pool),
            blobs=PostgresBlobStore(pool),
        )


def resources(request: Request) -> ApiResources:
    """FastAPI dependency: the running app's resources."""
    res = request.app.state.resources
    if not isinstance(res, ApiResources):  # pragma: no cover - lifespan did not run
        raise RuntimeError("the API's lifespan has not started")
    return res
