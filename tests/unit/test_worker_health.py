"""A worker's endpoints (toolfleet.observability.health): /livez follows the event loop's
heartbeat, /readyz the worker's consumers, /metrics stays Prometheus's exposition.

The clock is injected: a stuck loop is a clock that moves while nothing beats.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Iterable
from wsgiref.util import setup_testing_defaults

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from tests.support.eventually import eventually
from toolfleet.observability.health import (
    STALE_AFTER_S,
    WorkerHealth,
    health_app,
    serve_endpoints,
    serve_http,
)

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Flag:
    def __init__(self, value: bool = False) -> None:
        self.value = value

    def __call__(self) -> bool:
        return self.value


def registry_with_a_metric() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("toolfleet_test_events", "Events.", ["service"], registry=registry).labels(
        "audit"
    ).inc()
    return registry


Response = tuple[int, dict[str, str], bytes]


def call(
    health: WorkerHealth,
    path: str,
    *,
    method: str = "GET",
    registry: CollectorRegistry | None = None,
) -> Response:
    """One request through the WSGI app, no socket."""
    environ: dict[str, object] = {"PATH_INFO": path, "REQUEST_METHOD": method}
    setup_testing_defaults(environ)
    answered: list[tuple[str, list[tuple[str, str]]]] = []

    def start_response(
        status: str, headers: list[tuple[str, str]], exc_info: object = None
    ) -> Callable[[bytes], object]:
        answered.append((status, headers))
        return lambda _: None

    app = health_app(health, registry=registry or registry_with_a_metric())
    body = b"".join(app(environ, start_response))
    ((status, headers),) = answered
    return int(status.split()[0]), dict(headers), body


def one_line_json(body: bytes) -> dict[str, object]:
    text = body.decode()
    assert text.endswith("\n"), text
    assert "\n" not in text[:-1], text
    loaded = json.loads(text)
    assert isinstance(loaded, dict)
    return loaded


# --- liveness --------------------------------------------------------------------------------


def test_live_while_the_heartbeat_is_fresh() -> None:
    clock = Clock()
    health = WorkerHealth(clock=clock)
    clock.now += STALE_AFTER_S - 0.5
    status, headers, body = call(health, "/livez")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    assert one_line_json(body) == {"live": True, "heartbeat_age_s": STALE_AFTER_S - 0.5}


def test_a_stale_heartbeat_is_503_with_its_age() -> None:
    clock = Clock()
    health = WorkerHealth(clock=clock)
    clock.now += 12.5  # the loop did not beat for 12.5 s: stuck
    status, _, body = call(health, "/livez")
    assert status == 503
    assert one_line_json(body) == {"live": False, "heartbeat_age_s": 12.5}
    health.beat()  # it turns again
    assert call(health, "/livez")[0] == 200


def test_the_threshold_is_the_workers_own() -> None:
    clock = Clock()
    health = WorkerHealth(clock=clock, stale_after_s=2.0)
    clock.now += 3.0
    assert call(health, "/livez")[0] == 503


async def test_the_heartbeat_task_stamps_from_the_loop() -> None:
    clock = Clock()
    health = WorkerHealth(clock=clock)
    clock.now += 60.0
    assert not health.liveness().ok
    beating = asyncio.create_task(health.heartbeat(interval_s=3600))
    try:
        await eventually(lambda: asyncio.sleep(0, health.liveness().ok), timeout=5)
    finally:
        beating.cancel()
    assert health.liveness().body == {"live": True, "heartbeat_age_s": 0.0}


# --- readiness -------------------------------------------------------------------------------


def test_not_ready_before_the_consumers_are_built() -> None:
    status, _, body = call(WorkerHealth(), "/readyz")
    assert status == 503
    assert one_line_json(body) == {
        "ready": False,
        "reason": "starting: producer and consumers not up yet",
    }


def test_not_ready_while_a_consumer_waits_for_partitions() -> None:
    health = WorkerHealth()
    audit, status_group = Flag(True), Flag(False)
    health.serving([("toolfleet.audit", audit), ("toolfleet.status", status_group)])
    status, _, body = call(health, "/readyz")
    assert status == 503
    assert one_line_json(body) == {
        "ready": False,
        "reason": "joining groups: toolfleet.status",
    }
    status_group.value = True
    status, _, body = call(health, "/readyz")
    assert status == 200
    assert one_line_json(body) == {"ready": True}


def test_every_waiting_group_is_named_once() -> None:
    health = WorkerHealth()
    consumers: Iterable[tuple[str, Flag]] = [
        ("toolfleet.b", Flag()),
        ("toolfleet.a", Flag()),
        ("toolfleet.b", Flag()),
    ]
    health.serving(consumers)
    assert health.readiness().body["reason"] == "joining groups: toolfleet.a, toolfleet.b"


def test_a_worker_without_consumers_is_ready_once_built() -> None:
    """``toolfleet worker maintenance``: a background job, no consumer group."""
    health = WorkerHealth()
    health.serving([])
    assert call(health, "/readyz")[0] == 200


def test_a_stopping_worker_is_not_ready() -> None:
    stopping = Flag()
    health = WorkerHealth(stopping=stopping)
    health.serving([("toolfleet.audit", Flag(True))])
    assert call(health, "/readyz")[0] == 200
    stopping.value = True
    status, _, body = call(health, "/readyz")
    assert status == 503
    assert one_line_json(body) == {"ready": False, "reason": "stopping"}
    assert call(health, "/livez")[0] == 200  # draining is alive: no restart mid-drain


# --- the router ------------------------------------------------------------------------------


def test_metrics_are_still_prometheus_text() -> None:
    status, headers, body = call(WorkerHealth(), "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=")
    assert 'toolfleet_test_events_total{service="audit"} 1.0' in body.decode()


def test_an_unknown_path_is_404_not_metrics() -> None:
    status, _, body = call(WorkerHealth(), "/")
    assert status == 404
    assert b"toolfleet_test_events" not in body


def test_probes_answer_get_and_head_only() -> None:
    health = WorkerHealth()
    health.serving([])
    status, headers, body = call(health, "/readyz", method="HEAD")
    assert (status, body) == (200, b"")
    assert int(headers["Content-Length"]) > 0
    status, headers, _ = call(health, "/livez", method="POST")
    assert status == 405
    assert headers["Allow"] == "GET, HEAD"


# --- over a socket ---------------------------------------------------------------------------


def get(url: str) -> tuple[int, bytes]:
    response = httpx.get(url, timeout=5, trust_env=False)
    return response.status_code, response.content


def test_the_thread_answers_503_while_the_loop_is_stuck() -> None:
    """Nothing beats (no loop runs here) while the clock moves: the HTTP thread still
    answers, and says the loop is stuck."""
    clock = Clock()
    health = WorkerHealth(clock=clock)
    with serve_http(health, host="127.0.0.1", port=0, registry=registry_with_a_metric()) as (
        host,
        port,
    ):
        base = f"http://{host}:{port}"
        assert get(f"{base}/livez")[0] == 200
        clock.now += 30.0
        status, body = get(f"{base}/livez")
        assert status == 503
        assert one_line_json(body) == {"live": False, "heartbeat_age_s": 30.0}
        status, body = get(f"{base}/readyz")
        assert status == 503
        assert one_line_json(body)["reason"] == "starting: producer and consumers not up yet"
        status, body = get(f"{base}/metrics")
        assert status == 200
        assert b"toolfleet_test_events_total" in body


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_an_ipv6_host_binds_an_ipv6_socket() -> None:
    health = WorkerHealth()
    health.serving([])
    with serve_http(health, host="::1", port=0) as (_, port):
        assert get(f"http://[::1]:{port}/readyz")[0] == 200


async def test_the_endpoints_beat_while_they_serve() -> None:
    clock = Clock()
    health = WorkerHealth(clock=clock)
    async with serve_endpoints(health, host="127.0.0.1", port=0) as (host, port):
        clock.now += 60.0  # as if the loop had been stuck for a minute: the task beats again

        async def live() -> bool:
            status, _ = await asyncio.to_thread(get, f"http://{host}:{port}/livez")
            return status == 200

        await eventually(live, timeout=10)
