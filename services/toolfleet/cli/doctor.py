"""``toolfleet doctor``: check this deployment against what production needs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from toolfleet.cli.config import load_settings
from toolfleet.cli.output import console, err_console, print_json
from toolfleet.settings import FleetSettings

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def doctor(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the checks as one JSON document on stdout.")
    ] = False,
    timeout: Annotated[
        float,
        typer.Option(min=0.1, help="Seconds each check (and reaching each service) may take."),
    ] = 5.0,
    topics_file: Annotated[
        Path | None,
        typer.Option(help="Topic definitions to use instead of the packaged topics.yaml."),
    ] = None,
) -> None:
    """Check keys, Kafka TLS/SASL, broker APIs, topics, retention, replication, Redis
    persistence, migrations and executor pools: one line per check, exit 1 on any
    failure. Under TOOLFLEET_BROKER_PROFILE=dev, what only production needs warns."""
    from toolfleet.doctor.run import examine, failed

    settings = load_settings(FleetSettings)
    profile = settings.broker_profile
    results = asyncio.run(
        examine(settings, profile=profile, timeout_s=timeout, topics_file=topics_file)
    )
    if as_json:
        print_json(
            {
                "profile": profile,
                "ok": not failed(results),
                "checks": [result.as_dict() for result in results],
            }
        )
    else:
        err_console.print(
            f"toolfleet doctor: {profile} profile, brokers {escape(settings.kafka_bootstrap)}"
        )
        for result in results:
            status, rest = result.line().split(" ", 1)
            console.print(
                f"[{_STYLE[result.status.value]}]{status}[/] {escape(rest)}", soft_wrap=True
            )
    if failed(results):
        raise typer.Exit(1)
