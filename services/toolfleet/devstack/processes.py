"""Supervised child processes: started, logged, restarted with backoff, stopped.

A child's output goes to its log file (and, verbose, to the terminal); when it dies the
terminal gets one line on how it ended, its last :data:`TAIL_LINES` lines and what comes
next (a restart after a delay), so a crash is visible without the chatter of a healthy
start.

Each child runs in its own process group, so a Ctrl-C in the terminal reaches only the
supervisor, which then stops the children in order (SIGTERM, a grace period, SIGKILL).
Every child also gets SIGTERM from the kernel if the supervisor dies
(:func:`~toolfleet.devstack.children.child_preexec`), so none outlives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from toolfleet.devstack.children import child_preexec
from toolfleet.devstack.console import DevConsole, death_lines, shown_path

#: Longest line read from a child at once; longer lines are dropped with a note.
_LINE_LIMIT = 1 << 20
#: After a child exits, how long its remaining output may take to drain.
_DRAIN_S = 2.0
#: Lines of a dead child's output shown on the terminal.
TAIL_LINES = 20
#: Exits of a child told to stop that need no word: it drained, or it was killed.
_STOPPED_EXITS = (0, -signal.SIGTERM, -signal.SIGKILL)


@dataclass(frozen=True, kw_only=True)
class ServiceSpec:
    """How to run one service of the fleet."""

    name: str
    """Name in logs and in ``logs/<name>.log`` (``executor``, ``api`` ...)."""
    argv: tuple[str, ...]
    """Command line; ``argv[0]`` is an executable path."""
    env: Mapping[str, str] = field(default_factory=dict)
    """The child's complete environment."""
    cwd: Path | None = None
    """Working directory (``None``: the supervisor's)."""
    url: str | None = None
    """Where the service answers HTTP, shown once it is up (the API's URL)."""


@dataclass(frozen=True, kw_only=True)
class RestartPolicy:
    """Exponential backoff between restarts of a child that keeps dying."""

    initial_delay_s: float = 1.0
    """Delay before the first restart."""
    max_delay_s: float = 30.0
    """The delay doubles per consecutive crash up to this."""
    stable_after_s: float = 30.0
    """A child that ran this long counts as healthy again: the next delay starts over."""

    def delay(self, consecutive_crashes: int) -> float:
        """Seconds to wait before restart number ``consecutive_crashes`` (1-based)."""
        exponent = max(consecutive_crashes - 1, 0)
        return float(min(self.initial_delay_s * 2**exponent, self.max_delay_s))


def describe_exit(returncode: int) -> str:
    """``exit code 1`` or ``killed by SIGKILL``."""
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


@dataclass(frozen=True, kw_only=True)
class Ended:
    """How one run of a child ended."""

    pid: int | None
    """``None``: it could not be started."""
    returncode: int | None
    reason: str
    """``exit code 1``, ``killed by SIGKILL``, ``could not start: ...``."""
    tail: tuple[str, ...]
    """Its last lines of output (at most :data:`TAIL_LINES`)."""


class SupervisedProcess:
    """One service: runs it until :meth:`terminate`, restarting it whenever it dies."""

    def __init__(
        self, spec: ServiceSpec, *, console: DevConsole, restart: RestartPolicy | None = None
    ) -> None:
        self.spec = spec
        self._console = console
        self._restart = restart or RestartPolicy()
        self._proc: asyncio.subprocess.Process | None = None
        self.pids: list[int] = []
        """Every pid this service has had (tests check none survives)."""
        self.restarts = 0
        """How many times the service was restarted after dying."""
        self._halt = asyncio.Event()
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)

    @property
    def pid(self) -> int | None:
        """The pid of its latest child (``None`` before the first start)."""
        return self.pids[-1] if self.pids else None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def running(self) -> bool:
        """Whether a child process is alive right now."""
        return self._proc is not None and self._proc.returncode is None

    async def run(self) -> None:
        """Keep the service running until :meth:`terminate`; return once its child exited."""
        loop = asyncio.get_running_loop()
        crashes = 0
        shown: tuple[str, ...] | None = None  # the tail shown at the streak's last crash
        while not self._halt.is_set():
            started = loop.time()
            ended = await self._run_once()
            if self._halt.is_set():
                self._report_stopped(ended)
                return
            crashes = 1 if loop.time() - started >= self._restart.stable_after_s else crashes + 1
            delay = self._restart.delay(crashes)
            next_step = f"restarting {self.name} in {delay:g}s" + (
                f" (crash {crashes} in a row)" if crashes > 1 else ""
            )
            for row in death_lines(
                self.name,
                pid=ended.pid,
                reason=ended.reason,
                tail=ended.tail,
                log_path=self._console.log_path(self.name),
                next_step=next_step,
                show_tail=not self._console.verbose,  # verbose: it is on the terminal already
                same_as_before=crashes > 1 and ended.tail == shown,
            ):
                self._console.say(row)
            shown = ended.tail
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._halt.wait(), delay)
                return
            self.restarts += 1

    def terminate(self) -> None:
        """Stop the service: no more restarts; SIGTERM to the child (services drain)."""
        self._halt.set()
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """Stop the service now: no more restarts; SIGKILL to the child."""
        self._halt.set()
        self._signal(signal.SIGKILL)

    def _report_stopped(self, ended: Ended) -> None:
        """A child told to stop needs no word, unless it ended badly (a crash on drain)."""
        if ended.returncode not in _STOPPED_EXITS:
            log = shown_path(self._console.log_path(self.name))
            self._console.say(f"{self.name} ended badly while stopping: {ended.reason} ({log})")

    async def _run_once(self) -> Ended:
        """Start the child, forward its output until it exits; say how it ended."""
        self._tail.clear()
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.spec.argv,
                env=dict(self.spec.env),
                cwd=self.spec.cwd,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                limit=_LINE_LIMIT,
                process_group=0,
                preexec_fn=child_preexec,
            )
        except OSError as exc:
            reason = f"could not start: {exc.strerror or type(exc).__name__}"
            return Ended(pid=None, returncode=None, reason=reason, tail=())
        self._proc = proc
        self.pids.append(proc.pid)
        self._console.mark(self.name, f"started pid {proc.pid}")
        if self.restarts:
            self._console.say(f"{self.name} restarted: pid {proc.pid}")
        if self._halt.is_set():  # terminate() came while the child was starting
            self._signal(signal.SIGTERM)
        assert proc.stdout is not None
        pump = asyncio.create_task(self._forward(proc.stdout))
        returncode = await proc.wait()
        with contextlib.suppress(TimeoutError):
            # Output left in the pipe after exit; a grandchild holding it open must not hang us.
            await asyncio.wait_for(asyncio.shield(pump), _DRAIN_S)
        pump.cancel()
        described = describe_exit(returncode)
        self._console.mark(self.name, f"pid {proc.pid} ended: {described}")
        return Ended(pid=proc.pid, returncode=returncode, reason=described, tail=tuple(self._tail))

    async def _forward(self, stream: asyncio.StreamReader) -> None:
        while True:
            try:
                raw = await stream.readline()
            except ValueError:
                text = f"[a line over {_LINE_LIMIT} bytes was dropped]"
            else:
                if not raw:
                    return
                text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            self._tail.append(text)
            self._console.line(self.name, text)

    def _signal(self, sig: signal.Signals) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


async def stop_all(
    processes: list[SupervisedProcess], tasks: list[asyncio.Task[None]], *, grace_s: float = 15.0
) -> list[str]:
    """SIGTERM every child, wait up to ``grace_s``, SIGKILL the rest; return their names."""
    for process in processes:
        process.terminate()
    _, pending = await asyncio.wait(tasks, timeout=grace_s) if tasks else (set(), set())
    stragglers = [p.name for p in processes if p.running]
    for process in processes:
        process.kill()
    if pending:
        await asyncio.wait(pending, timeout=10)
    return stragglers
