"""The Celery peer of ``e2e_bench.py``: a no-op task through Celery, same machine, same run.

    python bench/celery_peer.py [--n 2000] [--paced 200]      # prints one JSON object

Celery (Redis broker and result backend, ``acks_late``, prefork pool of 2 processes,
like the fleet's two-core budget) runs a no-op task. A ``redis-server`` of its own is
started on a free loopback port, so nothing else shares it. Measured:

- saturated: ``--n`` tasks published at once, then joined: tasks per second, and the CPU
  seconds of the worker (parent and pool) and its Redis per task;
- paced: ``--paced`` tasks one at a time (publish, wait for the result): p50 / p99.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from celery import Celery
from celery.result import ResultSet

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probes import CpuMeter, rss_mb


def make_app(redis_url: str) -> Celery:
    app = Celery("toolfleet_bench_peer", broker=redis_url, backend=redis_url)
    app.conf.update(
        task_acks_late=True,
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )

    @app.task(name="noop")
    def noop() -> None:
        return None

    return app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server(work: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(work),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError("redis-server did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0", proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


@contextlib.contextmanager
def celery_worker(redis_url: str, work: Path) -> Iterator[int]:
    argv = [sys.executable, __file__, "--worker", redis_url]
    with (work / "celery.log").open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def pct(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


def measure(n: int, paced: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="toolfleet-celery-") as tmp:
        work = Path(tmp)
        with redis_server(work) as (url, redis_pid), celery_worker(url, work) as worker_pid:
            app = make_app(url)
            noop = app.tasks["noop"]
            deadline = time.monotonic() + 60
            while True:  # the worker is up once a task comes back
                try:
                    noop.delay().get(timeout=5)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
            ResultSet([noop.delay() for _ in range(min(n, 200))]).join_native(timeout=120)

            meter = CpuMeter({"celery": [worker_pid], "redis": [redis_pid]})
            meter.start()
            started = time.perf_counter()
            results = ResultSet([noop.delay() for _ in range(n)])
            results.join_native(timeout=300)
            elapsed = time.perf_counter() - started
            cpu = meter.stop()

            latencies = []
            for _ in range(paced):
                t0 = time.perf_counter()
                noop.delay().get(timeout=30)
                latencies.append(time.perf_counter() - t0)
            latencies.sort()
            rss = sum(rss_mb([worker_pid]).values())
            app.close()
    cpu_s = sum(r.cpu_s for r in cpu.values())
    return {
        "name": "celery (5.x, redis, prefork 2, acks_late, no-op)",
        "n": n,
        "throughput_per_s": n / elapsed,
        "cpu_ms_per_task": cpu_s / n * 1000,
        "cpu_ms_per_task_by_process": {k: v.cpu_s / n * 1000 for k, v in cpu.items()},
        "paced_p50_ms": pct(latencies, 0.50),
        "paced_p99_ms": pct(latencies, 0.99),
        "paced_mean_ms": statistics.fmean(latencies) * 1000 if latencies else 0.0,
        "worker_rss_mb": rss,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        app = make_app(argv[1])
        app.worker_main(
            [
                "worker",
                "-P",
                "prefork",
                "-c",
                "2",
                "--loglevel",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
            ]
        )
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=2000, help="tasks in the saturated run")
    parser.add_argument("--paced", type=int, default=200, help="tasks run one at a time")
    args = parser.parse_args(argv)
    os.environ.setdefault("C_FORCE_ROOT", "1")  # the bench may run as root in CI
    print(json.dumps(measure(args.n, args.paced)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
