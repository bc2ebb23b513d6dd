"""``toolfleet worker NAME [--pool POOL]...``, run without the command-line framework.

A worker process lives for days and reads two arguments. Loading typer (with its own
click) and everything the other commands share to parse them was 2.5 MB of every
worker's memory, which issue 36 holds to 80 MB. So :func:`toolfleet.cli.main.main`
hands a well-formed worker command line to :func:`run_parsed` here, which imports no
typer; anything else (``--help``, an unknown option, a missing name, a name or pool
that does not check out) goes to the typer command, which prints the help or the
usage error. Both run :func:`run_worker_command`, so a worker starts the same way
either way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from toolfleet.cli.config import load_settings
from toolfleet.cli.errors import CliError, friendly, reaching_fleet
from toolfleet.settings import FleetSettings


class WorkerName(StrEnum):
    """The services ``toolfleet worker`` can run."""

    POLICY = "policy"
    EXECUTOR = "executor"
    VALIDATOR = "validator"
    AUDIT = "audit"
    STATUS = "status"
    MAINTENANCE = "maintenance"
    """Retention: prunes (and optionally archives) rows past their age."""
    ANALYTICS = "analytics"
    """The stream analytics app (faust-streaming; ``toolfleet[analytics]``)."""


class WorkerArgumentError(ValueError):
    """A worker name or pool that does not check out; ``param`` names the argument."""

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerCommand:
    """A checked ``toolfleet worker`` command line."""

    name: str
    """One service, or several joined by ``+``."""
    services: tuple[str, ...]
    """The services ``name`` runs."""
    pools: tuple[str, ...]
    """Executor pools from ``--pool``, checked, each once, in the order given."""


def parse_worker_argv(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """``NAME`` and the ``--pool`` values of ``toolfleet worker``'s arguments, or None
    when they are anything else (help, another option, no name or two): the typer
    command answers those, as it always has."""
    name: str | None = None
    pools: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--pool":
            value = next(args, None)
            if value is None:
                return None
            pools.append(value)
        elif arg.startswith("--pool="):
            pools.append(arg.removeprefix("--pool="))
        elif arg.startswith("-") or name is not None:
            return None
        else:
            name = arg
    return None if name is None else (name, pools)


def check_worker_command(name: str, pools: Sequence[str]) -> WorkerCommand:
    """The command, checked. Raises :class:`WorkerArgumentError` naming the argument."""
    if name != WorkerName.ANALYTICS:
        from toolfleet.worker import worker_services

        try:
            services = worker_services(name)
        except ValueError as exc:
            raise WorkerArgumentError(str(exc), param="NAME") from None
    else:
        services = (name,)
    checked = pool_names(pools)
    if checked and WorkerName.EXECUTOR not in services:
        raise WorkerArgumentError("only an executor serves pools", param="--pool")
    return WorkerCommand(name=name, services=services, pools=checked)


def pool_names(given: Sequence[str]) -> tuple[str, ...]:
    """The ``--pool`` values, each checked, once each in the order given. Raises
    :class:`WorkerArgumentError` at the first bad one."""
    from toolfleet.events.types import check_pool_name

    names: list[str] = []
    for value in given:
        try:
            name = check_pool_name(value)
        except ValueError as exc:
            raise WorkerArgumentError(str(exc), param="--pool") from None
        if name not in names:
            names.append(name)
    return tuple(names)


def run_worker_command(command: WorkerCommand) -> None:
    """Run the worker until SIGTERM (its failures to start as :class:`CliError`)."""
    if command.name == WorkerName.ANALYTICS:
        from toolfleet.analytics.app import run
        from toolfleet.analytics.settings import AnalyticsSettings

        analytics = load_settings(AnalyticsSettings)
        with reaching_fleet(analytics):
            run(analytics)
        return
    from toolfleet.errors import ToolfleetError
    from toolfleet.worker import require_keys, run_worker

    if command.pools:
        # The executor reads its pools from its own settings (ExecutorSettings).
        os.environ["TOOLFLEET_EXECUTOR_POOLS"] = ",".join(command.pools)
    settings = load_settings(FleetSettings)
    try:
        require_keys(command.name, settings)  # one line saying how to fix it, not a traceback
        if WorkerName.EXECUTOR in command.services:
            # Before connecting: a tool module that cannot be imported is one line.
            from toolfleet.registry.catalog import import_tool_modules

            import_tool_modules(settings.tool_module_list)
    except ToolfleetError as exc:
        raise CliError(exc.message) from None
    with reaching_fleet(settings):
        run_worker(command.name, settings)


def run_parsed(argv: Sequence[str]) -> bool:
    """Run ``toolfleet worker`` from its arguments (those after ``worker``) if they are
    well formed and check out; False, having run nothing, when the typer command should
    answer them instead."""
    parsed = parse_worker_argv(argv)
    if parsed is None:
        return False
    try:
        command = check_worker_command(*parsed)
    except WorkerArgumentError:
        return False
    try:
        friendly(run_worker_command)(command)
    except KeyboardInterrupt:
        # Before the worker's loop handles SIGINT (it drains then): as click ends a command.
        print("Aborted!", file=sys.stderr)
        raise SystemExit(1) from None
    return True
