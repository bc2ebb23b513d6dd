"""The HTTP API in process, for the integration tests that call it (see
:mod:`tests.support.api`). A module overrides a fixture by defining one of the same name."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from tests.support.api import (
    ApiKeys,
    api_settings_for,
    asgi_client,
    running_app,
    token_issuer,
    write_api_keys,
)
from toolfleet.api import ApiSettings
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.settings import FleetSettings


@pytest.fixture(scope="module")
def api_keys(tmp_path_factory: pytest.TempPathFactory) -> ApiKeys:
    return write_api_keys(tmp_path_factory.mktemp("api-keys"))


@pytest.fixture(scope="module")
def api_settings(settings: FleetSettings, api_keys: ApiKeys) -> ApiSettings:
    return api_settings_for(settings, api_keys)


@pytest.fixture(scope="module")
def issuer(api_keys: ApiKeys, api_settings: ApiSettings) -> TokenIssuer:
    return token_issuer(api_keys, api_settings)


@pytest.fixture(scope="module")
async def app(api_settings: ApiSettings) -> AsyncIterator[FastAPI]:
    async with running_app(api_settings) as application:
        yield application


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(app) as client:
        yield client
