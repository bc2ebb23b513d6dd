"""``toolfleet tools``: browse and search the registry, and move versions along their lifecycle.

Every command goes through the HTTP API (``--token`` or ``TOOLFLEET_TOKEN``, else an
admin token minted from the configured private key, which the command announces on
stderr); lifecycle changes need the admin scope and are audited with the token's subject.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Column, Table
from rich.text import Text

from toolfleet.cli.errors import CliError, friendly
from toolfleet.cli.output import console, print_json
from toolfleet.cli.remote import JsonOption, TokenOption, _session

app = typer.Typer(help="Browse, search and operate the tool registry.", no_args_is_help=True)

_PAGE_SIZE = 200

ToolVersionArgument = Annotated[
    str, typer.Argument(metavar="TOOL@VERSION", help="e.g. acme__search@1.2.0", show_default=False)
]
InFavorOfOption = Annotated[
    str | None,
    typer.Option(
        "--in-favor-of",
        help="The successor: a version of this tool (2.0.0) or a tool (acme__x@1.0.0).",
    ),
]
MessageOption = Annotated[
    str | None, typer.Option("--message", help="Added to the warnings callers see.")
]
DeprecationDateOption = Annotated[
    str | None,
    typer.Option(
        "--deprecation-date",
        help="From when callers are warned (YYYY-MM-DD, UTC, or ISO 8601; default: now).",
    ),
]


@app.command("list")
@friendly
def list_tools(
    category: Annotated[str | None, typer.Option(help="Only this category.")] = None,
    tag: Annotated[str | None, typer.Option(help="Only tools with this tag.")] = None,
    query: Annotated[
        str | None, typer.Option("-q", "--query", help="Rank by meaning (like `search`).")
    ] = None,
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """List registered tools with each version's lifecycle state and dates."""
    session = _session(token)
    params: dict[str, Any] = {
        k: v for k, v in {"category": category, "tag": tag, "q": query}.items() if v
    }
    items: list[dict[str, Any]] = []
    page = 1
    while True:
        body = session.call(
            "GET", "/v1/tools", params={**params, "page": page, "page_size": _PAGE_SIZE}
        )
        items += body["items"]
        if not body["items"] or len(items) >= body["total"]:
            break
        page += 1
    if json_:
        print_json(items)
        return
    if not items:
        console.print("no tools registered yet (executors register theirs when they start)")
        return
    _print_tools(items)


@app.command("search")
@friendly
def search(
    text: Annotated[str, typer.Argument(help="What the tool should do, in plain words.")],
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=200)] = 5,
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """The tools your token may call that best match TEXT by meaning, best first."""
    body = _session(token).call("GET", "/v1/tools", params={"q": text, "page_size": limit})
    items = body["items"]
    if json_:
        print_json(items)
        return
    if not items:
        console.print("no tool this token may call matches that")
        return
    _print_tools(items, ranked=True)


#: Below this many columns the table drops its category column, puts the description
#: under the tool id and breaks each version's lifecycle into short lines, so nothing
#: is cut at a normal 80-column terminal.
WIDE_TABLE = 120


def _print_tools(items: list[dict[str, Any]], *, ranked: bool = False) -> None:
    if console.width < WIDE_TABLE:
        _print_narrow(items, ranked=ranked)
        return
    columns: list[Column | str] = [Column("tool", no_wrap=True), "versions", "effect"]
    ranks: list[Column | str] = [Column("#", justify="right"), Column("score", justify="right")]
    table = Table(*(ranks if ranked else []), *columns, "category", "description")
    for rank, tool in enumerate(items, start=1):
        versions = Text("\n".join(", ".join(_lifecycle(v)) for v in tool["versions"]))
        row = [tool["tool_id"], versions, _effect(tool), Text(tool["category"])]
        row.append(Text(tool["description"]))
        table.add_row(*([str(rank), _score(tool)] if ranked else []), *row)
    console.print(table)


def _print_narrow(items: list[dict[str, Any]], *, ranked: bool) -> None:
    """The same facts for a narrow terminal: no box; the tool's effect and description
    under its id; one lifecycle fact per line (the version and state first, the rest
    indented below it)."""
    lifecycles = ["\n".join("\n  ".join(_lifecycle(v)) for v in tool["versions"]) for tool in items]
    # The lifecycle lines keep their width; the tool column takes what is left and wraps.
    widest = max((len(line) for text in lifecycles for line in text.splitlines()), default=0)
    ranks = [Column("#", justify="right"), Column("score", justify="right")]
    table = Table(
        *(ranks if ranked else []),
        Column("tool", ratio=1, overflow="fold"),
        Column("versions", width=max(widest, len("versions")), overflow="fold"),
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for rank, (tool, lifecycle) in enumerate(zip(items, lifecycles, strict=True), start=1):
        name = Text(tool["tool_id"], style="bold")
        if _effect(tool):
            name.append(f"\n{_effect(tool)}", style="italic")
        if tool["description"]:
            name.append(f"\n{tool['description']}", style="dim")
        table.add_row(*([str(rank), _score(tool)] if ranked else []), name, Text(lifecycle))
    console.print(table)


def _effect(tool: dict[str, Any]) -> str:
    effect = str(tool["versions"][0]["effect"]) if tool["versions"] else ""
    return f"{effect} (approval)" if tool.get("requires_approval") else effect


def _score(tool: dict[str, Any]) -> str:
    score = tool.get("score")
    text = "" if score is None else f"{score:.2f}"
    return f"{text} (weak)" if tool.get("low_relevance") else text


def _lifecycle(version: dict[str, Any]) -> list[str]:
    """One version's facts, joined for a line: ``1.0.0 deprecated since 2026-11-02``,
    ``sunset on 2027-01-31``, ``use 2.0.0`` (an announced deprecation shows on an active
    version as ``deprecated from``)."""
    state = str(version["lifecycle_state"])
    parts = [f"{version['version']} {state}"]
    deprecation = _day(version.get("deprecation_date"))
    sunset = _day(version.get("sunset_date"))
    if state == "sunset":
        parts[0] += f" since {sunset}" if sunset else ""
    else:
        if state == "active" and deprecation:
            parts.append(f"deprecated from {deprecation}")
        elif deprecation:
            parts[0] += f" since {deprecation}"
        if sunset:
            parts.append(f"sunset on {sunset}")
    if version.get("deprecated_in_favor_of"):
        parts.append(f"use {version['deprecated_in_favor_of']}")
    return parts


def _day(when: object) -> str | None:
    return str(when)[:10] if when else None


def _split(target: str) -> tuple[str, str]:
    tool_id, sep, version = target.partition("@")
    if not sep or not tool_id or not version:
        raise CliError(f"{target!r}: name a version as TOOL@VERSION (e.g. acme__search@1.2.0)")
    return tool_id, version


def _when(text: str | None, *, option: str = "--date") -> str | None:
    """A date option: a day (``2027-01-31``, midnight UTC) or an ISO 8601 time."""
    if text is None:
        return None
    try:
        if len(text) == 10:
            return datetime.combine(date.fromisoformat(text), datetime.min.time(), UTC).isoformat()
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CliError(f"{option} {text!r}: use YYYY-MM-DD or an ISO 8601 time") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).isoformat()


def _change(
    target: str,
    state: str,
    *,
    token: str | None,
    json_: bool,
    sunset_date: str | None = None,
    deprecation_date: str | None = None,
    in_favor_of: str | None = None,
    message: str | None = None,
) -> None:
    tool_id, version = _split(target)
    payload = {
        "lifecycle_state": state,
        "sunset_date": _when(sunset_date),
        "deprecation_date": _when(deprecation_date, option="--deprecation-date"),
        "deprecated_in_favor_of": in_favor_of,
        "message": message,
    }
    body = _session(token).call(
        "PATCH",
        f"/v1/tools/{tool_id}/versions/{version}",
        json={k: v for k, v in payload.items() if v is not None},
    )
    if json_:
        print_json(body)
        return
    text = f"{tool_id}@{version}: {body['previous_state']} → {body['lifecycle_state']}"
    if body.get("deprecation_date") and body["lifecycle_state"] == "active":
        text += f" (deprecated from {body['deprecation_date']})"
    if body.get("sunset_date"):
        text += f" (sunset {body['sunset_date']})"
    if body.get("deprecated_in_favor_of"):
        text += f"; successor {body['deprecated_in_favor_of']}"
    console.print(text, markup=False)


@app.command("deprecate")
@friendly
def deprecate(
    target: ToolVersionArgument,
    in_favor_of: InFavorOfOption = None,
    sunset_date: Annotated[
        str | None,
        typer.Option("--date", help="Announced sunset date (YYYY-MM-DD, UTC, or ISO 8601)."),
    ] = None,
    deprecation_date: DeprecationDateOption = None,
    message: MessageOption = None,
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """Deprecate a version: calls still run, with a warning naming the successor and date
    (from --deprecation-date on, if given)."""
    _change(
        target,
        "deprecated",
        token=token,
        json_=json_,
        sunset_date=sunset_date,
        deprecation_date=deprecation_date,
        in_favor_of=in_favor_of,
        message=message,
    )


@app.command("sunset")
@friendly
def sunset(
    target: ToolVersionArgument,
    in_favor_of: InFavorOfOption = None,
    sunset_date: Annotated[
        str | None,
        typer.Option("--date", help="When the sunset takes effect (default: now)."),
    ] = None,
    deprecation_date: DeprecationDateOption = None,
    message: MessageOption = None,
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """Sunset a version: only tenants whose policy pins it may still call it."""
    _change(
        target,
        "sunset",
        token=token,
        json_=json_,
        sunset_date=sunset_date,
        deprecation_date=deprecation_date,
        in_favor_of=in_favor_of,
        message=message,
    )


@app.command("remove")
@friendly
def remove(
    target: ToolVersionArgument, json_: JsonOption = False, token: TokenOption = None
) -> None:
    """Remove a version: it never runs again and leaves every list."""
    _change(target, "removed", token=token, json_=json_)
