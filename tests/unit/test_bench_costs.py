"""The e2e bench's cost figures: what is counted as the fleet's CPU and what is reported
apart (the bench's own client, the Postgres and Redis servers on the same cores)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from e2e_bench import CLIENT, Costs, RunResult, costs_of, goal_verdicts
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


def fleet_run(rss_mb: dict[str, float]) -> RunResult:
    costs = Costs(
        cpu_ms_per_inv=3.0, cpu_ms_by_process={}, paced_p50_ms=20.0, paced_p99_ms=40.0,
        rss_mb_after_run=rss_mb,
    )  # fmt: skip
    return RunResult(
        name="fleet", completed=2000, failed=0, elapsed_s=4.0, throughput_per_s=500.0,
        p50_ms=1.0, p99_ms=2.0, mean_ms=1.0, max_ms=2.0, outcomes={}, costs=costs,
    )  # fmt: skip


def test_each_goal_is_judged_and_throughput_is_set_beside_the_contracts_floor() -> None:
    ratios = {
        "throughput floor/baseline": 0.48,
        "throughput floor/celery": 1.63,
        "throughput fleet/baseline": 0.18,
        "throughput fleet/celery": 0.59,
        "paced p50 fleet-baseline (ms)": 14.2,
        "paced p99 fleet/baseline": 1.08,
        "idle cores (sum)": 0.086,
        "first after idle max / paced p99": 1.35,
        "process throughput / in-process": 0.27,
        "process paced p50 - in-process (ms)": 18.3,
    }
    verdicts = {v.goal: v for v in goal_verdicts(ratios, fleet_run({"policy": 96.0}))}

    chain = verdicts["throughput >= 0.3x the bare chain"]
    assert (chain.measured, chain.met) == ("0.18x", False)
    assert chain.verdict == "NOT MET (the contract's floor: 0.48x)"
    assert verdicts["throughput >= 1.5x Celery"].verdict == "NOT MET (the contract's floor: 1.63x)"
    assert verdicts["paced p50 <= the chain's + 10 ms"].measured == "+14.2 ms"
    assert verdicts["paced p99 <= 2x the chain's"].verdict == "met"
    assert verdicts["idle fleet <= 10% of a core"].measured == "8.6% of a core"
    assert verdicts["first call after idle <= paced p99"].met is False
    rss = verdicts["worker RSS < 150 MB"]
    assert (rss.met, rss.verdict) == (True, "met (after 2,000 calls, not 100k)")
    process = verdicts['isolation="process" at a stated cost']
    assert (process.measured, process.verdict) == ("0.27x calls/s, +18.3 ms p50", "stated")


def test_goals_a_run_did_not_measure_are_left_out() -> None:
    verdicts = goal_verdicts({"throughput fleet/baseline": 0.35}, fleet_run({"audit": 160.0}))

    assert [(v.goal, v.verdict) for v in verdicts] == [
        ("throughput >= 0.3x the bare chain", "met"),
        ("worker RSS < 150 MB", "NOT MET (after 2,000 calls, not 100k)"),
    ]
