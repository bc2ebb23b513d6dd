"""CPU and memory of the processes a benchmark runs, read with psutil.

A :class:`CpuMeter` reads the CPU time (user + system) of a set of processes, their
children included, at the start and end of a phase: the difference is the CPU the phase
cost, whatever else the machine runs meanwhile (wall-clock throughput is noisy on a
shared box; CPU seconds per unit of work much less so).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import psutil  # type: ignore[import-untyped]

#: A worker's resident memory issue 13 allows (after 100k calls, no growth after warm-up).
RSS_GOAL_MB = 150.0
#: What issue 36 allows each worker process after warm-up (the API is not a worker).
WORKER_RSS_GOAL_MB = 80.0


def _tree(pids: Iterable[int], *, children: bool = True) -> list[psutil.Process]:
    procs: list[psutil.Process] = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            procs.append(proc)
            if children:
                procs.extend(proc.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return procs


def cpu_seconds(pids: Iterable[int], *, children: bool = True) -> dict[int, float]:
    """CPU seconds so far of each process under ``pids`` (children too, unless told), by pid.

    With children, a process's figure includes the children it has reaped (the
    executor's one-shot tool processes), and its live children have figures of their own.
    """
    seconds: dict[int, float] = {}
    for proc in _tree(pids, children=children):
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        reaped = times.children_user + times.children_system if children else 0.0
        seconds[proc.pid] = times.user + times.system + reaped
    return seconds


@dataclass(frozen=True, kw_only=True)
class CpuReading:
    """CPU a group of processes used over one phase."""

    cpu_s: float
    wall_s: float

    @property
    def cores(self) -> float:
        """Average cores busy over the phase (1.0 = one core fully)."""
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


class CpuMeter:
    """CPU used by ``groups`` of processes between :meth:`start` and :meth:`stop`.

    Each group counts its processes' children too, but for the groups named in ``alone``
    (the benchmark's own process, whose children are the fleet).
    """

    def __init__(self, groups: Mapping[str, Sequence[int]], *, alone: Sequence[str] = ()) -> None:
        self._groups = groups
        self._alone = set(alone)
        self._before: dict[str, dict[int, float]] = {}
        self._started = 0.0

    def start(self) -> None:
        self._before = {
            name: cpu_seconds(pids, children=name not in self._alone)
            for name, pids in self._groups.items()
        }
        self._started = time.perf_counter()

    def stop(self) -> dict[str, CpuReading]:
        wall = time.perf_counter() - self._started
        readings: dict[str, CpuReading] = {}
        for name, pids in self._groups.items():
            after = cpu_seconds(pids, children=name not in self._alone)
            before = self._before.get(name, {})
            # A process born during the phase counts from zero.
            used = sum(after[pid] - before.get(pid, 0.0) for pid in after)
            readings[name] = CpuReading(cpu_s=max(used, 0.0), wall_s=wall)
        return readings


def listening_pids(ports: Iterable[int]) -> dict[int, int]:
    """The pid of the process listening on each of ``ports`` (TCP, this machine), where
    one does and may be read: a server the benchmark did not start (Postgres, Redis)."""
    wanted = set(ports)
    found: dict[int, int] = {}
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return found
    for conn in connections:
        listening = conn.status == psutil.CONN_LISTEN and conn.pid is not None
        if listening and conn.laddr and conn.laddr.port in wanted:
            found.setdefault(conn.laddr.port, conn.pid)
    return found


def rss_mb(pids: Iterable[int]) -> dict[int, float]:
    """Resident set size of each process under ``pids`` (children included), in MB."""
    sizes: dict[int, float] = {}
    for proc in _tree(pids):
        try:
            sizes[proc.pid] = proc.memory_info().rss / 1_048_576
        except psutil.NoSuchProcess:
            continue
    return sizes


def uss_mb(pids: Iterable[int]) -> dict[int, float]:
    """Unique set size (memory no other process shares: what stopping it frees) of each
    process under ``pids``, in MB. RSS counts also the pages of shared libraries it
    touched, which every process mapping the same file shares (from /proc/PID/smaps)."""
    sizes: dict[int, float] = {}
    for proc in _tree(pids):
        try:
            sizes[proc.pid] = proc.memory_full_info().uss / 1_048_576
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sizes


def children_named(fragment: str) -> list[int]:
    """Pids of this process's children whose command line contains ``fragment``."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if any(fragment in part for part in proc.cmdline()):
                found.append(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return found
