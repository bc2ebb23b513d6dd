"""toolfleet's producer client: publish invocations, cancel, approve, wait for outcomes.

Two transports, one request builder:

- :class:`ToolfleetClient` publishes to Kafka and waits on the results topic
  (``pip install 'toolfleet[fleet]'``); the CLI and the HTTP API publish through it.
- :class:`ToolfleetHttpClient` goes through the HTTP API (core install: httpx only),
  with a ``transport=`` seam for tests.

Exports load on first use, so ``ToolfleetHttpClient`` works without aiokafka installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolfleet.client.handles import InvocationHandle, Progress
    from toolfleet.client.http import ApiError, ApiUnavailable, ToolfleetHttpClient
    from toolfleet.client.kafka import ToolfleetClient
    from toolfleet.client.requests import invoke_request

_EXPORTS = {
    "ApiError": "toolfleet.client.http",
    "ApiUnavailable": "toolfleet.client.http",
    "ToolfleetHttpClient": "toolfleet.client.http",
    "InvocationHandle": "toolfleet.client.handles",
    "Progress": "toolfleet.client.handles",
    "ToolfleetClient": "toolfleet.client.kafka",
    "invoke_request": "toolfleet.client.requests",
}

__all__ = [
    "ApiError",
    "ApiUnavailable",
    "InvocationHandle",
    "Progress",
    "ToolfleetClient",
    "ToolfleetHttpClient",
    "invoke_request",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
