"""redis-py's own OpenTelemetry metrics stay out of a worker: import this module before
anything imports redis.

redis-py (8.x here) imports ``opentelemetry.sdk.metrics`` as it is imported, only to
learn whether the SDK is installed (``redis.observability.providers`` catches the
``ImportError``). toolfleet never turns redis-py's metrics on (its own are Prometheus
counters, :mod:`toolfleet.observability.metrics`), yet that probe loads the metrics SDK
and ctypes under it: 1.1 to 1.2 MB of resident memory in every worker process (issue 36:
a worker stays within 80 MB; ``python -c 'import toolfleet.worker'``: 57.2 MB before,
56.0 MB after). It also loads the SDK's resources and psutil, which tracing imports
only when spans are exported (:mod:`toolfleet.observability.tracing_sdk`): 1.6 MB more
per worker that exports none.

While redis is imported, the metrics SDK is marked absent in ``sys.modules`` (the
interpreter's documented way to make an import raise ``ImportError``); redis-py then
records that its metrics are unavailable, as it does where the SDK is not installed.
The mark is removed at once: a later ``import opentelemetry.sdk.metrics`` (an exporter,
a test) works as before. Importing this module after redis changes nothing.
"""

from __future__ import annotations

import importlib
import sys

METRICS_SDK = "opentelemetry.sdk.metrics"
"""The package redis-py probes for (and that toolfleet does not use)."""


def import_redis_without_metrics_sdk() -> None:
    """Import ``redis.asyncio`` (and ``redis``) without the OpenTelemetry metrics SDK,
    unless either was imported already."""
    if "redis" in sys.modules or METRICS_SDK in sys.modules:
        return
    sys.modules[METRICS_SDK] = None  # type: ignore[assignment]
    try:
        importlib.import_module("redis.asyncio")
    finally:
        if sys.modules.get(METRICS_SDK, 0) is None:
            del sys.modules[METRICS_SDK]


import_redis_without_metrics_sdk()
