"""The ``toolfleet`` command: one typer app, commands grouped as contract section 6 names them.

Every command reads ``TOOLFLEET_*`` variables (and ``.env``). Expected failures print a
one-line reason (:class:`~toolfleet.cli.errors.CliError`); tracebacks never show local
variables, which may hold tokens.
"""

from __future__ import annotations

import logging
import sys

import typer
from rich.markup import escape

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
from toolfleet.cli.extras import missing_extra_message
from toolfleet.cli.output import err_console

app = typer.Typer(
    name="toolfleet",
    help="toolfleet: an event-driven tool execution layer for AI agents, over Kafka.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

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


@app.callback()
def _quiet_libraries() -> None:
    # Client libraries log connection retries; commands report failures themselves.
    # ``worker`` and ``api`` configure logging of their own on top of this.
    for name in ("aiokafka", "kafka"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


app.add_typer(tools.app, name="tools")
app.add_typer(tokens.app, name="token")
app.add_typer(keys.app, name="keys")
app.add_typer(audit.app, name="audit")
app.add_typer(policy.app, name="policy")
app.add_typer(agent.app, name="agent")
app.add_typer(sources.app, name="sources")


def main() -> None:
    """Console-script entry point; a command whose install extra is missing says which."""
    try:
        app(prog_name="toolfleet")
    except ModuleNotFoundError as exc:
        message = missing_extra_message(exc, sys.argv[1:])
        if message is None:
            raise
        err_console.print(f"[bold red]Error:[/] {escape(message)}")
        raise SystemExit(1) from None
