"""The FastAPI application: routers, problem handlers, metrics and the clients' lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.routing import Route

import toolfleet
from toolfleet.api.console import routes as console
from toolfleet.api.mcp import MCP_PATH, McpService
from toolfleet.api.metrics import HttpMetricsMiddleware
from toolfleet.api.problems import install_problem_handlers, problem_media_types
from toolfleet.api.resources import open_resources
from toolfleet.api.routes import analytics, events, health, invocations, policies, sources, tools
from toolfleet.api.settings import ApiSettings


def create_app(settings: ApiSettings) -> FastAPI:
    """Build the API; its clients are opened when the app starts and closed when it stops."""
    mcp = McpService.create()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_resources(settings) as res, mcp.running():
            app.state.resources = res
            yield

    app = FastAPI(
        title="toolfleet status API",
        version=toolfleet.__version__,
        summary="Submit tool invocations and follow them to their outcome.",
        lifespan=lifespan,
    )
    install_problem_handlers(app)
    app.add_middleware(HttpMetricsMiddleware)
    app.include_router(health.router)
    app.include_router(invocations.router)
    app.include_router(events.router)
    app.include_router(events.feed_router)
    app.include_router(console.router)
    app.include_router(console.page_router)
    app.include_router(tools.router)
    app.include_router(policies.router)
    app.include_router(sources.router)
    app.include_router(analytics.router)
    # MCP's transport answers GET, POST and DELETE itself (405 where stateless has none).
    app.router.routes.append(
        Route(MCP_PATH, mcp.endpoint, methods=["GET", "POST", "DELETE"], include_in_schema=False)
    )
    _serve_problem_media_types(app)
    return app


def _serve_problem_media_types(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = problem_media_types(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
