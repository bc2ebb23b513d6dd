"""``toolfleet invoke``: publish an invoke request, optionally wait for its outcome."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.markup import escape
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from toolfleet.cli.config import load_settings, mint
from toolfleet.cli.errors import CliError, reaching_fleet
from toolfleet.cli.output import console, err_console, print_details, print_json, styled_status
from toolfleet.cli.params import parse_params
from toolfleet.client.handles import InvocationHandle
from toolfleet.client.handles import Progress as InvocationProgress
from toolfleet.events.models import DocumentContext, InvocationStatus, ToolOutcome
from toolfleet.events.types import EventType, Source
from toolfleet.settings import FleetSettings

if TYPE_CHECKING:
    from toolfleet.client.publisher import KafkaPublisher

DEFAULT_AGENT = "did:agent:cli"
DEFAULT_WAIT_S = 300.0

_PHASE_OF_EVENT: dict[str, str] = {
    EventType.INVOKED: "running",
    EventType.APPROVAL_REQUESTED: "waiting for approval",
    EventType.INVOKE_QUEUED: "queued (no executor of its pool)",
}


@dataclass(frozen=True, kw_only=True)
class InvokeCommand:
    """One ``toolfleet invoke`` call, parsed."""

    tool_id: str
    parameters: dict[str, Any]
    tenant_id: str
    agent_did: str
    tool_version: str
    token: str
    require_approval: bool
    document_context: DocumentContext | None = None


def document_context(documents: list[str], source: str | None) -> DocumentContext | None:
    """``--document ID[@VERSION]`` (repeated) and ``--document-source``, as a request's
    ``document_context``; None when no document is named."""
    if not documents:
        if source is not None:
            raise CliError("--document-source needs at least one --document")
        return None
    refs = []
    for entry in documents:
        document_id, sep, version = entry.partition("@")
        if not document_id or (sep and not version):
            raise CliError(f"--document takes ID or ID@VERSION, got {entry!r}")
        refs.append({"document_id": document_id, "version": version or None})
    try:
        return DocumentContext.model_validate({"documents": refs, "source": source})
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        raise CliError(f"--document: {first['msg']}") from None


class ProgressDisplay:
    """A rich progress bar on stderr fed by the client's progress callbacks."""

    def __init__(self, tool_id: str) -> None:
        self._bar = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[phase]}"),
            TimeElapsedColumn(),
            console=err_console,
            transient=True,
        )
        self._task: TaskID = self._bar.add_task(tool_id, total=100, phase="pending")

    def __enter__(self) -> ProgressDisplay:
        self._bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.stop()

    def update(self, progress: InvocationProgress) -> None:
        phase = progress.current_phase or _PHASE_OF_EVENT.get(progress.event_type, "")
        fields: dict[str, Any] = {"phase": escape(phase)} if phase else {}
        if progress.progress_percent is not None:
            fields["completed"] = progress.progress_percent
        self._bar.update(self._task, **fields)


@asynccontextmanager
async def _started(settings: FleetSettings, *, watch: bool) -> AsyncIterator[KafkaPublisher]:
    """A started publisher, stopped on exit even when starting it failed half-way."""
    from toolfleet.client.publisher import KafkaPublisher  # the fleet extra: imported on use

    async with KafkaPublisher(settings, source=Source.CLI, watch=watch) as client:
        yield client


async def _publish(settings: FleetSettings, options: InvokeCommand) -> InvocationHandle:
    async with _started(settings, watch=False) as client:
        return await _send(client, options)


async def _send(client: KafkaPublisher, options: InvokeCommand) -> InvocationHandle:
    return await client.invoke(
        options.tool_id,
        options.parameters,
        tenant_id=options.tenant_id,
        agent_did=options.agent_did,
        tool_version=options.tool_version,
        capability_token=options.token,
        require_approval=options.require_approval,
        document_context=options.document_context,
    )


async def _call_and_wait(
    settings: FleetSettings, options: InvokeCommand, *, timeout: float, show_progress: bool
) -> tuple[InvocationHandle, ToolOutcome | None]:
    async with _started(settings, watch=True) as client:
        handle = await _send(client, options)
        display = ProgressDisplay(options.tool_id) if show_progress else None
        try:
            if display is None:
                return handle, await client.wait(handle, timeout=timeout)
            with display:
                outcome = await client.wait(handle, timeout=timeout, on_progress=display.update)
            return handle, outcome
        except TimeoutError:
            return handle, None


def invoke(
    tool_id: Annotated[str, typer.Argument(help="Tool id, e.g. core__echo.", show_default=False)],
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant id.", show_default=False)],
    param: Annotated[
        list[str] | None,
        typer.Option("-p", "--param", help="key=value; the value is JSON if it parses."),
    ] = None,
    params_json: Annotated[
        str | None, typer.Option("--params-json", help="All parameters as a JSON object.")
    ] = None,
    agent: Annotated[str, typer.Option("--agent", help="Calling agent's DID.")] = DEFAULT_AGENT,
    version: Annotated[
        str, typer.Option("--version", help="Exact version or range (^1.2.0, ~1.2, *).")
    ] = "*",
    token: Annotated[
        str | None,
        typer.Option(
            "--token", help="Capability token (default: minted from the configured private key)."
        ),
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the outcome.")] = False,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds --wait waits at most.")
    ] = DEFAULT_WAIT_S,
    require_approval: Annotated[
        bool, typer.Option("--require-approval", help="Hold the call for a human's approval.")
    ] = False,
    document: Annotated[
        list[str] | None,
        typer.Option(
            "--document",
            help="ID or ID@VERSION: a document the tool may read (ctx.documents); repeatable.",
        ),
    ] = None,
    document_source: Annotated[
        str | None, typer.Option("--document-source", help="Document source of --document.")
    ] = None,
    json_: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Invoke a tool. With --wait, exit 0 only if it succeeds."""
    settings = load_settings(FleetSettings)
    options = InvokeCommand(
        tool_id=tool_id,
        parameters=parse_params(param or [], params_json),
        tenant_id=tenant,
        agent_did=agent,
        tool_version=version,
        token=token
        or mint(settings, tenant_id=tenant, agent_did=agent, tool_id=tool_id, tool_version=version),
        require_approval=require_approval,
        document_context=document_context(document or [], document_source),
    )
    if not wait:
        with reaching_fleet(settings):
            handle = asyncio.run(_publish(settings, options))
        if json_:
            print_json(
                {"invocation_id": handle.invocation_id, "tenant_id": tenant, "status": "pending"}
            )
        else:
            console.print(handle.invocation_id, markup=False)
        return
    with reaching_fleet(settings):
        handle, outcome = asyncio.run(
            _call_and_wait(settings, options, timeout=timeout, show_progress=not json_)
        )
    if outcome is None:
        raise CliError(
            f"no outcome within {timeout:g}s; the invocation may still finish: "
            f"toolfleet status {handle.invocation_id}"
        )
    _print_outcome(outcome, as_json=json_)
    if outcome.status is not InvocationStatus.SUCCESS:
        raise typer.Exit(1)


def _print_outcome(outcome: ToolOutcome, *, as_json: bool) -> None:
    data = outcome.model_dump(mode="json")
    if as_json:
        print_json(data)
        return
    version = f"@{outcome.tool_version}" if outcome.tool_version else ""
    console.print(
        f"{styled_status(outcome.status.value)}  {outcome.tool_id}{version}  "
        f"[dim]{outcome.invocation_id}[/]"
    )
    print_details(data)
