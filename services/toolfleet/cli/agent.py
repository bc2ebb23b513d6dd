"""``toolfleet agent replay FILE``: re-run a recorded agent loop with no model and no fleet.

The bundle's model turns are fed to the loop again and the fleet answers from the
recorded outcomes. ``--manifests`` (a changed tool: JSON of manifests, or of
``GET /v1/tools/{id}`` answers), ``--allow`` and ``--deny-effect`` (a changed policy)
show where such a change would make the run diverge. Exit code 1 when it diverges.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from toolfleet.agent.replay import ReplayReport, read_bundle, replay
from toolfleet.cli.errors import CliError, friendly
from toolfleet.cli.output import console, print_json
from toolfleet.cli.remote import JsonOption
from toolfleet.contract.manifest import ToolManifest
from toolfleet.errors import ProviderSchemaError

app = typer.Typer(help="The agent runner's tools (replay bundles).", no_args_is_help=True)


def _manifests(file: Path) -> list[ToolManifest]:
    try:
        data: Any = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read manifests from {file}: {exc}") from None
    items = data if isinstance(data, list) else [data]
    found: list[ToolManifest] = []
    try:
        for item in items:
            if isinstance(item, dict) and "versions" in item:  # a GET /v1/tools/{id} answer
                found += [ToolManifest.model_validate(v) for v in item["versions"]]
            else:
                found.append(ToolManifest.model_validate(item))
    except ValidationError as exc:
        raise CliError(f"{file} holds an invalid manifest: {exc.error_count()} error(s)") from None
    return found


@app.command("replay")
@friendly
def replay_command(
    file: Annotated[Path, typer.Argument(help="A replay bundle (.jsonl).", show_default=False)],
    manifests: Annotated[
        Path | None,
        typer.Option("--manifests", help="Replay against these tool manifests (JSON)."),
    ] = None,
    allow: Annotated[
        list[str] | None,
        typer.Option("--allow", help="Only these tools (globs) are allowed; repeatable."),
    ] = None,
    deny_effect: Annotated[
        list[str] | None,
        typer.Option("--deny-effect", help="Deny this effect for the run; repeatable."),
    ] = None,
    json_: JsonOption = False,
) -> None:
    """Replay a recorded run and show where it diverges."""
    try:
        bundle = read_bundle(file)
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read the bundle {file}: {exc}") from None
    try:
        report = asyncio.run(
            replay(
                bundle,
                manifests=_manifests(manifests) if manifests else None,
                allow_tools=allow,
                denied_effects=deny_effect,
            )
        )
    except ProviderSchemaError as exc:
        raise CliError(exc.message) from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    _print(report, bundle.header.run_id, json_)
    if not report.reproduced:
        raise typer.Exit(1)


def _print(report: ReplayReport, run_id: str, json_: bool) -> None:
    if json_:
        print_json(
            {
                "run_id": run_id,
                "turns": report.turns,
                "calls": report.calls,
                "reproduced": report.reproduced,
                "divergences": [
                    {"turn": d.turn, "index": d.index, "tool": d.tool, "reason": d.reason}
                    for d in report.divergences
                ],
            }
        )
        return
    # Piped (not a terminal), a line stays one line, so the documented one can be grepped.
    soft_wrap = not console.is_terminal
    console.print(
        f"run {run_id}: {report.turns} turns, {report.calls} calls replayed",
        markup=False,
        soft_wrap=soft_wrap,
    )
    if report.reproduced:
        console.print(
            "reproduced: every call has the recorded id, version and outcome", soft_wrap=soft_wrap
        )
        return
    for divergence in report.divergences:
        console.print(f"diverges at {divergence}", markup=False, soft_wrap=soft_wrap)
