"""toolfleet's client: one :class:`Client` shape over the HTTP API and over the broker.

    async with connect_http("http://localhost:8080", token=token) as client: ...
    async with connect_kafka(FleetSettings(), tenant_id="t1", token=token) as client: ...

Both give a :class:`Client` (:mod:`toolfleet.client.protocol`) with the same methods,
signatures and results; what a transport cannot do raises :class:`NotSupportedByTransport`.
:func:`connect_http` needs only httpx (core install); :func:`connect_kafka` the
``fleet`` extra. :class:`~toolfleet.client.publisher.KafkaPublisher` is the fleet's own
publisher (the API, the CLI), acting for any tenant; users open a :class:`Client`.

Exports load on first use, so ``connect_http`` works without aiokafka installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from toolfleet.client.handles import InvocationHandle, Progress
    from toolfleet.client.http import ApiError, ApiUnavailable, HttpClient, connect_http
    from toolfleet.client.kafka import KafkaClient, connect_kafka
    from toolfleet.client.protocol import Client, NotSupportedByTransport
    from toolfleet.client.publisher import KafkaPublisher
    from toolfleet.client.requests import invoke_request
    from toolfleet.contract.progress import InvocationEvent

_EXPORTS = {
    "ApiError": "toolfleet.client.http",
    "ApiUnavailable": "toolfleet.client.http",
    "Client": "toolfleet.client.protocol",
    "HttpClient": "toolfleet.client.http",
    "InvocationEvent": "toolfleet.contract.progress",
    "InvocationHandle": "toolfleet.client.handles",
    "KafkaClient": "toolfleet.client.kafka",
    "KafkaPublisher": "toolfleet.client.publisher",
    "NotSupportedByTransport": "toolfleet.client.protocol",
    "Progress": "toolfleet.client.handles",
    "connect_http": "toolfleet.client.http",
    "connect_kafka": "toolfleet.client.kafka",
    "invoke_request": "toolfleet.client.requests",
}

__all__ = [
    "ApiError",
    "ApiUnavailable",
    "Client",
    "HttpClient",
    "InvocationEvent",
    "InvocationHandle",
    "KafkaClient",
    "KafkaPublisher",
    "NotSupportedByTransport",
    "Progress",
    "connect_http",
    "connect_kafka",
    "invoke_request",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
