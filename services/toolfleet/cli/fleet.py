"""Commands that run parts of the fleet: ``dev``, ``init``, ``api`` and ``worker``."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, cast

import typer

from toolfleet.cli import output
from toolfleet.cli.config import load_settings
from toolfleet.cli.errors import CliError, reaching_fleet, redacted
from toolfleet.cli.output import print_json, print_topic_report
from toolfleet.cli.worker_command import (
    WorkerArgumentError,
    WorkerName,
    check_worker_command,
    pool_names,
    run_worker_command,
)
from toolfleet.settings import FleetSettings


def _devstack(module: str, attribute: str) -> object:
    # Imported on use, by name: the supervisor pulls in the embedded servers, which
    # only ``dev`` needs, and may be absent from slim installations.
    try:
        loaded = importlib.import_module(f"toolfleet.devstack.{module}")
    except ModuleNotFoundError as exc:
        if exc.name != f"toolfleet.devstack.{module}":
            raise
        raise CliError(f"this installation has no toolfleet.devstack.{module}") from None
    return getattr(loaded, attribute)


def dev(
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            envvar="TOOLFLEET_DEV_VERBOSE",
            help="Stream every service's output to the terminal too (it always goes to "
            "$TOOLFLEET_HOME/logs/<service>.log).",
        ),
    ] = False,
) -> None:
    """Run the whole fleet and the API on this machine (embedded servers where unset)."""
    run_dev = cast(Callable[..., int], _devstack("supervisor", "run_dev"))
    raise typer.Exit(run_dev(verbose=verbose))


def init(
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Only compare the topics with topics.yaml; change nothing, fail on drift.",
        ),
    ] = False,
    apply: Annotated[
        bool,
        typer.Option("--apply", help="Also alter existing topics' configs to match."),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the topic report as JSON on stdout.")
    ] = False,
    topics_file: Annotated[
        Path | None,
        typer.Option(help="Topic definitions to use instead of the packaged topics.yaml."),
    ] = None,
    pool: Annotated[
        list[str] | None,
        typer.Option(
            "--pool",
            help="Also the topic of this executor pool (invoke.authorized.NAME, configured "
            "as invoke.authorized); repeatable. For clusters where the services may not "
            "create topics.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Migrate Postgres, create the topics (retention and cleanup from topics.yaml) and
    register the installed tools; report topics whose configs drifted."""
    from toolfleet.bus.admin import sync_fleet_topics
    from toolfleet.bus.topics import TopicMode
    from toolfleet.devstack.bootstrap import bootstrap

    if check and apply:
        raise CliError("--check and --apply exclude each other")
    pools = _pool_names(pool)
    settings = load_settings(FleetSettings)
    with reaching_fleet(settings):
        if check:
            report = asyncio.run(
                sync_fleet_topics(
                    settings, mode=TopicMode.CHECK, topics_file=topics_file, pools=pools
                )
            )
        else:
            mode = TopicMode.APPLY if apply else TopicMode.CREATE
            report = asyncio.run(bootstrap(settings, topic_mode=mode, topics_file=topics_file))
            if pools:
                pooled = asyncio.run(
                    sync_fleet_topics(settings, mode=mode, topics_file=topics_file, pools=pools)
                )
                report.created += [t for t in pooled.created if t not in report.created]
    if as_json:
        print_json(report.as_dict())
    else:
        print_topic_report(report)
    if check and not report.clean:
        raise typer.Exit(1)
    if not check:
        output.err_console.print(
            "[green]fleet initialised[/]: database migrated, topics and tools ready"
        )


def worker(
    name: Annotated[
        str,
        typer.Argument(
            help="Which service to run: "
            + ", ".join(w.value for w in WorkerName)
            + "; several joined by '+' run in one process (audit+status read each "
            "lifecycle record once).",
            metavar="NAME[+NAME...]",
            show_default=False,
        ),
    ],
    pool: Annotated[
        list[str] | None,
        typer.Option(
            "--pool",
            help="Executor only: serve this executor pool (read its topic "
            "invoke.authorized.NAME; 'default' is invoke.authorized); repeatable "
            "[TOOLFLEET_EXECUTOR_POOLS, default: default].",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run one service, or several in one process (shown as `toolfleet worker NAME` in
    ps); SIGTERM drains."""
    # A well-formed worker command line runs without typer (toolfleet.cli.worker_command);
    # this command answers the others, and tests drive it.
    try:
        command = check_worker_command(name, pool or [])
    except WorkerArgumentError as exc:
        raise _bad_parameter(exc) from None
    run_worker_command(command)


def _pool_names(given: list[str] | None) -> list[str]:
    """The ``--pool`` values, each checked, once each in the order given."""
    try:
        return list(pool_names(given or []))
    except WorkerArgumentError as exc:
        raise _bad_parameter(exc) from None


def _bad_parameter(exc: WorkerArgumentError) -> typer.BadParameter:
    """typer's usage error for a worker name or pool that does not check out."""
    return typer.BadParameter(str(exc), param_hint=exc.param)


def api(
    host: Annotated[str | None, typer.Option(help="Bind address [TOOLFLEET_API_HOST].")] = None,
    port: Annotated[int | None, typer.Option(help="Port [TOOLFLEET_API_PORT].")] = None,
) -> None:
    """Serve the status API (uvicorn)."""
    import uvicorn

    from toolfleet.api import ApiSettings, create_app
    from toolfleet.api.readiness import preflight
    from toolfleet.api.resources import load_verifier, require_grant_key
    from toolfleet.bus.connection import kafka_connection
    from toolfleet.errors import ToolfleetError
    from toolfleet.observability.logs import configure_logging
    from toolfleet.observability.tracing import configure_tracing, shutdown_tracing

    settings = load_settings(ApiSettings)
    # Fail here, readably, rather than with a traceback from inside the app's lifespan.
    try:
        load_verifier(settings)
        require_grant_key(settings)
        kafka_connection(settings)  # an unreadable CA or key file, said before serving
    except ToolfleetError as exc:
        raise CliError(exc.message) from None
    checks = asyncio.run(preflight(settings))
    failed = {name: state for name, state in checks.items() if state != "ok"}
    if failed:
        where = {
            "kafka": settings.kafka_bootstrap,
            "redis": redacted(settings.redis_url),
            "postgres": redacted(settings.database_url),
        }
        reasons = "; ".join(f"{name} {state} at {where[name]}" for name, state in failed.items())
        raise CliError(f"cannot start the API: {reasons}")
    configure_logging(service="api", level=settings.log_level, fmt=settings.log_format)
    configure_tracing(
        service="api", exporter=settings.otel_exporter, endpoint=settings.otel_endpoint
    )
    with contextlib.suppress(ImportError):
        import setproctitle

        setproctitle.setproctitle("toolfleet api")
    try:
        uvicorn.run(
            create_app(settings),
            host=host or settings.api_host,
            port=port or settings.api_port,
            log_config=None,
            access_log=False,
            server_header=False,
            # Open streams (the console's live list) never end on their own: on SIGTERM
            # they get the drain timeout, then the API stops anyway.
            timeout_graceful_shutdown=max(1, round(settings.drain_timeout_s)),
        )
    finally:
        shutdown_tracing()
