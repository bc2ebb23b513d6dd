"""A worker started the documented way (``toolfleet worker audit`` with
``TOOLFLEET_METRICS_PORT``) answers ``/readyz`` once its consumer is in its group, and
``/livez`` and ``/metrics`` beside it, on one port."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.eventually import eventually
from tests.support.fleet import fleet_env
from tests.support.pipeline import fleet_settings
from tests.support.servers import free_port, kill_quietly
from toolfleet.bus.admin import ensure_topics
from toolfleet.devstack.children import child_preexec
from toolfleet.settings import FleetSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@dataclass(frozen=True, kw_only=True)
class Worker:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@contextmanager
def worker_process(service: str, env: dict[str, str], log: Path) -> Iterator[Worker]:
    """``toolfleet worker SERVICE`` with its metrics port on a free port; SIGTERM after."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "toolfleet", "worker", service],
            env={**env, "TOOLFLEET_METRICS_PORT": str(port)},
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=child_preexec,  # no orphaned worker outlives a killed session
        )
    worker = Worker(proc=proc, port=port, log=log)
    try:
        yield worker
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            kill_quietly(proc)
    assert proc.returncode == 0, worker.tail()


@pytest.fixture
async def audit(settings: FleetSettings, tmp_path: Path) -> AsyncIterator[Worker]:
    local = fleet_settings(settings, tmp_path)  # its own topics: its own consumer group
    await ensure_topics(local)
    with worker_process("audit", fleet_env(local), tmp_path / "audit.log") as worker:
        yield worker


async def test_a_worker_is_ready_live_and_scraped_on_its_metrics_port(audit: Worker) -> None:
    base = f"http://127.0.0.1:{audit.port}"
    async with httpx.AsyncClient(base_url=base, timeout=5, trust_env=False) as http:
        answers: list[httpx.Response] = []

        async def ready() -> bool:
            assert audit.proc.poll() is None, audit.tail()
            try:
                response = await http.get("/readyz")
            except httpx.TransportError:
                return False  # not listening yet
            answers.append(response)
            return response.status_code == 200

        await eventually(ready, timeout=20, interval=0.1)
        # Every answer before it: 503 with a one-line JSON reason, never an error.
        for early in answers[:-1]:
            assert early.status_code == 503, early.text
            assert early.text.count("\n") == 1, early.text
            assert early.json()["ready"] is False
            assert early.json()["reason"]
        assert answers[-1].json() == {"ready": True}

        live = await http.get("/livez")
        assert live.status_code == 200
        assert live.json()["live"] is True

        metrics = await http.get("/metrics")
        assert metrics.status_code == 200
        assert 'toolfleet_in_flight_events{service="audit"}' in metrics.text
