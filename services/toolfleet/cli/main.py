"""The ``toolfleet`` command: one typer app, commands grouped as contract section 6 names them.

Every command reads ``TOOLFLEET_*`` variables (and ``.env``). Expected failures print a
one-line reason (:class:`~toolfleet.cli.errors.CliError`); tracebacks never show local
variables, which may hold tokens.

A worker process lives for days, so ``toolfleet worker NAME [--pool POOL]...`` runs
without typer at all (:mod:`toolfleet.cli.worker_command`: typer, its click and the
other commands' modules were 2.5 MB of every worker's memory; rich tables, httpx, jwt
and the agent runner, 10 to 24 MB before that). A worker command line that is not well
formed gets an app holding only that command, which prints its help or usage error.
Every other command line gets the whole app (:func:`full_app`, also ``app`` here, which
tests drive).
"""

from __future__ import annotations

import logging
import sys
from functools import cache
from typing import TYPE_CHECKING

from toolfleet.cli import output
from toolfleet.cli.extras import missing_extra_message
from toolfleet.cli.output import escape

if TYPE_CHECKING:
    import typer


def _quiet_libraries() -> None:
    # Client libraries log connection retries; commands report failures themselves.
    # ``worker`` and ``api`` configure logging of their own on top of this.
    for name in ("aiokafka", "kafka"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def _new_app() -> typer.Typer:
    import typer

    app = typer.Typer(
        name="toolfleet",
        help="toolfleet: an event-driven tool execution layer for AI agents, over Kafka.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_show_locals=False,
    )
    app.callback()(_quiet_libraries)
    return app


@cache
def worker_app() -> typer.Typer:
    """The app of ``toolfleet worker``: that command alone."""
    from toolfleet.cli import fleet
    from toolfleet.cli.errors import friendly

    app = _new_app()
    app.command("worker")(friendly(fleet.worker))
    return app


@cache
def full_app() -> typer.Typer:
    """Every command."""
    from toolfleet.cli import (
        agent,
        audit,
        doctor,
        fleet,
        invoke,
        keys,
        policy,
        remote,
        sources,
        tokens,
        tools,
    )
    from toolfleet.cli.errors import friendly

    app = _new_app()
    app.command("dev")(friendly(fleet.dev))
    app.command("init")(friendly(fleet.init))
    app.command("api")(friendly(fleet.api))
    app.command("worker")(friendly(fleet.worker))
    app.command("invoke")(friendly(invoke.invoke))
    app.command("status")(friendly(remote.status))
    app.command("cancel")(friendly(remote.cancel))
    app.command("approve")(friendly(remote.approve))
    app.command("deny")(friendly(remote.deny))
    app.command("doctor")(friendly(doctor.doctor))
    app.add_typer(tools.app, name="tools")
    app.add_typer(tokens.app, name="token")
    app.add_typer(keys.app, name="keys")
    app.add_typer(audit.app, name="audit")
    app.add_typer(policy.app, name="policy")
    app.add_typer(agent.app, name="agent")
    app.add_typer(sources.app, name="sources")
    return app


def __getattr__(name: str) -> typer.Typer:
    # ``from toolfleet.cli.main import app``: the whole app, built on first use.
    if name == "app":
        return full_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    """Console-script entry point; a command whose install extra is missing says which."""
    args = sys.argv[1:]
    try:
        if args[:1] == ["worker"]:
            from toolfleet.cli.worker_command import run_parsed

            _quiet_libraries()
            if run_parsed(args[1:]):
                return
            app = worker_app()
        else:
            app = full_app()
        app(prog_name="toolfleet")
    except ModuleNotFoundError as exc:
        message = missing_extra_message(exc, args)
        if message is None:
            raise
        output.err_console.print(f"[bold red]Error:[/] {escape(message)}")
        raise SystemExit(1) from None
