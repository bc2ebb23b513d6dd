"""The API's routers, one module per resource."""

from toolfleet.api.routes import health, invocations, tools

__all__ = ["health", "invocations", "tools"]
