"""The HTTP API run in process for integration tests: signing keys, settings, a token
issuer, the app with its lifespan, and an httpx client over ASGI.

``tests/integration/conftest.py`` binds these to fixtures (``api_keys``,
``api_settings``, ``issuer``, ``app``, ``http``); a test module that needs other settings
or more at start overrides one fixture and builds it from the same helpers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from toolfleet.api import ApiSettings, create_app
from toolfleet.auth.grants import ensure_grant_key
from toolfleet.auth.keys import generate_key_pair
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.settings import FleetSettings

BASE_URL = "http://api.test"
"""Where :func:`asgi_client` sends requests (no socket: ASGI)."""


@dataclass(frozen=True, kw_only=True)
class ApiKeys:
    """A JWT signing key pair, in memory and in the files the API's settings name."""

    private_pem: bytes
    public_pem: bytes
    private_file: Path
    public_file: Path


def bearer(token: str) -> dict[str, str]:
    """The ``Authorization`` header of a bearer ``token``."""
    return {"Authorization": f"Bearer {token}"}


def write_api_keys(folder: Path) -> ApiKeys:
    """A fresh key pair written to ``folder``."""
    pair = generate_key_pair()
    private, public = folder / "private.pem", folder / "public.pem"
    private.write_bytes(pair.private_pem)
    public.write_bytes(pair.public_pem)
    return ApiKeys(
        private_pem=pair.private_pem,
        public_pem=pair.public_pem,
        private_file=private,
        public_file=public,
    )


def api_settings_for(settings: FleetSettings, keys: ApiKeys, **update: Any) -> ApiSettings:
    """The fleet's settings as the API's, signing with ``keys``; ``update`` overrides.

    The API refuses to start without a grant key: one is made beside ``keys`` unless the
    fleet's settings or ``update`` name one.
    """
    grant_key = settings.grant_key_file or keys.private_file.parent / "grant.key"
    if "grant_key_file" not in update:
        ensure_grant_key(grant_key)
    fleet = settings.model_copy(
        update={
            "jwt_private_key_file": keys.private_file,
            "jwt_public_key_file": keys.public_file,
            "grant_key_file": grant_key,
            **update,
        }
    )
    return ApiSettings(**fleet.model_dump())


def token_issuer(keys: ApiKeys, api_settings: ApiSettings) -> TokenIssuer:
    """Issues tokens the API accepts."""
    return TokenIssuer(
        keys.private_pem,
        keys.public_pem,
        issuer=api_settings.jwt_issuer,
        audience=api_settings.jwt_audience,
    )


@contextlib.asynccontextmanager
async def running_app(api_settings: ApiSettings) -> AsyncIterator[FastAPI]:
    """The API app inside its lifespan (resources open)."""
    application = create_app(api_settings)
    async with application.router.lifespan_context(application):
        yield application


@contextlib.asynccontextmanager
async def asgi_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client that calls ``app`` in process."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
        yield client
