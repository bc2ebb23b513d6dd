"""The e2e bench's cost figures: what is counted as the fleet's CPU and what is reported
apart (the bench's own client, the Postgres and Redis servers on the same cores)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from e2e_bench import CLIENT, costs_of
from probes import CpuReading, listening_pids

pytestmark = pytest.mark.unit


def reading(cpu_s: float) -> CpuReading:
    return CpuReading(cpu_s=cpu_s, wall_s=10.0)


def test_client_and_servers_are_reported_apart_from_the_fleet() -> None:
    cpu = {
        "broker": reading(1.0),
        "policy": reading(0.5),
        CLIENT: reading(0.4),
        "postgres": reading(0.3),
        "redis": reading(0.1),
    }
    costs = costs_of(cpu, completed=1000, paced=[], paced_cpu={"postgres": reading(0.2)})

    assert costs.cpu_ms_per_inv == pytest.approx(1.5)
    assert costs.cpu_ms_by_process == {"broker": pytest.approx(1.0), "policy": pytest.approx(0.5)}
    assert costs.client_cpu_ms_per_inv == pytest.approx(0.4)
    assert costs.servers_cpu_ms_per_inv == {
        "postgres": pytest.approx(0.3),
        "redis": pytest.approx(0.1),
    }
    assert costs.paced_cpu_ms_by_process == {}


def test_a_listening_server_is_found_by_its_port() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert listening_pids([port]) == {port: os.getpid()}
    assert listening_pids([port]) == {}
