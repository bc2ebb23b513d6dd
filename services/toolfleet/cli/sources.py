"""``toolfleet sources add|list|tools|refresh|configure|remove``: MCP servers and HTTP APIs
as tool sources.

Through the API (admin token). ``add`` names exactly one of ``--stdio "CMD ..."``,
``--http URL`` (an MCP server) or ``--openapi SPEC`` (an OpenAPI 3 file whose
operations become HTTP tools). The API stores the source and an executor lists its
tools (the API starts and reaches no source): ``add`` and ``refresh`` wait for that
listing (``--wait``, 60 s) and print the tools registered, or why the listing failed,
or that no executor answered in time. None is callable until a policy names it.
Every source tool is ``external_side_effect`` until an operator
vouches for another (``configure NAME TOOL --effect read_only``): what the source says
of a tool (MCP ``readOnlyHint``, an HTTP method) is listed beside it as ``hints``, never
taken as its effect. ``configure NAME TOOL`` also sets what clients see of one tool's
results.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from pydantic import ValidationError

from toolfleet.cli.config import load_settings
from toolfleet.cli.errors import CliError, friendly
from toolfleet.cli.output import console, print_json
from toolfleet.cli.remote import ApiSession, JsonOption, TokenOption
from toolfleet.settings import FleetSettings
from toolfleet.sources import openapi
from toolfleet.sources.models import DEFAULT_MAX_RESPONSE_BYTES, SourceDefinition, SourceKind
from toolfleet.sources.rules import ToolRules

app = typer.Typer(
    help="Tool sources: MCP servers and HTTP APIs (admin token).", no_args_is_help=True
)


def _session(token: str | None) -> ApiSession:
    return ApiSession(load_settings(FleetSettings), token)


def _pairs(values: list[str], what: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key or not rest:
            raise CliError(f"{what} takes KEY=VALUE, got {value!r}")
        pairs[key] = rest
    return pairs


def definition(
    name: str,
    *,
    stdio: str | None,
    http: str | None,
    openapi_file: Path | None,
    base_url: str | None = None,
    tenant: str = "*",
    connection: str | None = None,
    headers: list[str] | None = None,
    redact: list[str] | None = None,
    env: list[str] | None = None,
    timeout_s: float = 30.0,
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    paths: list[str] | None = None,
    hosts: list[str] | None = None,
) -> SourceDefinition:
    """The source ``add`` sends, validated here so a typo fails before any request."""
    chosen = [x for x in (stdio, http, openapi_file) if x is not None]
    if len(chosen) != 1:
        raise CliError("name exactly one of --stdio, --http or --openapi")
    fields: dict[str, Any] = {
        "name": name,
        "tenant_id": tenant,
        "connection_id": connection,
        "credential_headers": _pairs(headers or [], "--header"),
        "credential_env": _pairs(env or [], "--env"),
        "redaction": {
            tool: [f for f in fields_.split(",") if f]
            for tool, fields_ in _pairs(redact or [], "--redact").items()
        },
        "timeout_s": timeout_s,
        "max_response_bytes": max_response_bytes,
        "filesystem_permissions": list(paths or []),
        "network_permissions": list(hosts or []),
    }
    if stdio is not None:
        fields |= {"kind": SourceKind.MCP_STDIO, "target": stdio}
    elif http is not None:
        fields |= {"kind": SourceKind.MCP_HTTP, "target": http}
    else:
        assert openapi_file is not None
        try:
            doc = openapi.parse(openapi_file.read_text())
            operations = openapi.operations(doc)
        except OSError as exc:
            raise CliError(f"cannot read {openapi_file}: {exc.strerror}") from None
        except openapi.OpenApiError as exc:
            raise CliError(f"{openapi_file}: {exc}") from None
        target = base_url or openapi.base_url(doc)
        if target is None:
            raise CliError(f"{openapi_file} names no server; pass --base-url URL")
        fields |= {"kind": SourceKind.HTTP, "target": target, "operations": operations}
    try:
        return SourceDefinition.model_validate(fields)
    except ValidationError as exc:
        raise CliError("not a valid source:\n" + _problems(exc, "(source)")) from None


def _problems(exc: ValidationError, whole: str) -> str:
    return "\n".join(
        f"  {'.'.join(str(p) for p in err['loc']) or whole}: {err['msg']}"
        for err in exc.errors(include_url=False, include_input=False)
    )


def tool_rules(
    *,
    allow: list[str] | None,
    result_validation: str,
    sanitize: list[str] | None,
    max_result_bytes: int | None,
) -> ToolRules:
    """The rules ``configure`` sends, validated here so a typo fails before any request."""
    actions: dict[str, str] = {}
    for value in sanitize or []:
        path, sep, action = value.rpartition("=")
        if not sep or not path or not action:
            raise CliError(f"--sanitize takes PATH=ACTION, got {value!r}")
        actions[path] = action
    try:
        return ToolRules.model_validate(
            {
                "allow": allow,
                "result_validation": result_validation,
                "sanitize": actions,
                "max_result_bytes": max_result_bytes,
            }
        )
    except ValidationError as exc:
        raise CliError("not valid result rules:\n" + _problems(exc, "(rules)")) from None


def _print_tools(tools: list[dict[str, Any]]) -> None:
    for tool in tools:
        line = f"  {tool['tool_id']}@{tool['version']}  {tool['effect']}"
        hints = tool.get("hints") or {}
        if hints:
            said = ", ".join(f"{k}={_hint(v)}" for k, v in sorted(hints.items()))
            line += f"  (source hints, not trusted: {said})"
        console.print(line, markup=False, soft_wrap=True)


def _hint(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


EFFECTS = ("read_only", "state_change", "external_side_effect")

#: How often a waiting command asks how the listing stands.
LISTING_POLL_S = 0.5

WaitOption = Annotated[
    float,
    typer.Option(
        "--wait",
        min=0,
        help="Seconds to wait for an executor to list the tools (0: do not wait).",
    ),
]


def _path(name: str) -> str:
    return f"/v1/sources/{quote(name, safe='')}"


def wait_for_listing(
    fetch: Callable[[], dict[str, Any]],
    listing: dict[str, Any],
    *,
    wait_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Any]:
    """``listing`` once it is no longer ``pending``, asking ``fetch`` again every
    half second, or as it stands after ``wait_s`` seconds."""
    deadline = clock() + wait_s
    while listing["state"] == "pending" and clock() < deadline:
        sleep(max(min(LISTING_POLL_S, deadline - clock()), 0.0))
        listing = fetch()
    return listing


def listing_problem(name: str, listing: dict[str, Any], *, waited_s: float) -> str | None:
    """Why the tools of ``name`` are not listed (None: they are, or nobody waited)."""
    if listing["state"] == "pending":
        if waited_s <= 0:
            return None
        return (
            f"{name} is stored, but no executor listed its tools within {waited_s:g} s: "
            "is an executor running (`toolfleet worker executor`, or `toolfleet dev`)? "
            f"`toolfleet sources tools {name}` shows them once listed"
        )
    if listing["state"] != "failed":
        return None
    error = listing.get("error") or {}
    problem = (
        f"{name} is stored, but listing its tools failed: {error.get('code', 'internal_error')}: "
        f"{error.get('message', '')}"
    )
    if listing.get("next_attempt_at"):
        return problem + (
            f" (executors try again at {listing['next_attempt_at']}; "
            f"`toolfleet sources refresh {name}` asks now)"
        )
    return problem + f" (`toolfleet sources refresh {name}` tries again)"


def _finish_listing(
    session: ApiSession,
    name: str,
    listing: dict[str, Any],
    *,
    wait_s: float,
    json_: bool,
    what: str,
) -> None:
    """Wait for the listing, then print the tools it registered (or why there are none)."""
    listing = wait_for_listing(
        lambda: session.call("GET", f"{_path(name)}/listing"), listing, wait_s=wait_s
    )
    view = session.call("GET", _path(name))
    listing = view.get("listing") or listing
    problem = listing_problem(name, listing, waited_s=wait_s)
    if json_:
        print_json(view)
    elif listing["state"] == "pending" and problem is None:
        console.print(
            f"{name}: {what}; an executor lists its tools (pending): "
            f"`toolfleet sources tools {name}` shows them",
            markup=False,
        )
    elif problem is None:
        console.print(f"{name}: {len(view['tools'])} tools registered", markup=False)
        _print_tools(view["tools"])
        console.print("none is callable until a policy names it in allow_tools", markup=False)
    if problem is not None:
        raise CliError(problem)


@app.command("add")
@friendly
def add(
    name: Annotated[str, typer.Argument(help="Source name (part of its tools' ids).")],
    stdio: Annotated[
        str | None, typer.Option("--stdio", help='MCP server command line: "CMD ARG ..."')
    ] = None,
    http: Annotated[str | None, typer.Option("--http", help="MCP server URL.")] = None,
    openapi_file: Annotated[
        Path | None, typer.Option("--openapi", help="OpenAPI 3 document (JSON or YAML).")
    ] = None,
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="Base URL of --openapi operations.")
    ] = None,
    tenant: Annotated[
        str, typer.Option("--tenant", help='The one tenant that may use it ("*": every one).')
    ] = "*",
    connection: Annotated[
        str | None, typer.Option("--connection", help="Connection holding its credentials.")
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option("--header", help="HEADER=CREDENTIAL: a credential sent as a header."),
    ] = None,
    redact: Annotated[
        list[str] | None,
        typer.Option("--redact", help="TOOL=field,...: result fields clients may see."),
    ] = None,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", help="VAR=CREDENTIAL: a credential in a stdio server's env."),
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds per call.")] = 30.0,
    max_response_bytes: Annotated[
        int,
        typer.Option("--max-response-bytes", help="Largest answer of an HTTP operation."),
    ] = DEFAULT_MAX_RESPONSE_BYTES,
    path: Annotated[
        list[str] | None,
        typer.Option("--path", help="/PATH or rw:/PATH a sandboxed stdio server may see."),
    ] = None,
    host: Annotated[
        list[str] | None,
        typer.Option("--host", help="A host a sandboxed stdio server may reach (egress)."),
    ] = None,
    wait: WaitOption = 60.0,
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """Register a source; an executor lists its tools (callable once a policy names them)."""
    source = definition(
        name,
        stdio=stdio,
        http=http,
        openapi_file=openapi_file,
        base_url=base_url,
        tenant=tenant,
        connection=connection,
        headers=header,
        redact=redact,
        env=env,
        timeout_s=timeout,
        max_response_bytes=max_response_bytes,
        paths=path,
        hosts=host,
    )
    session = _session(token)
    body = session.call("POST", "/v1/sources", json=source.model_dump(mode="json"))
    _finish_listing(session, name, body["listing"], wait_s=wait, json_=json_, what="stored")


@app.command("refresh")
@friendly
def refresh(
    name: Annotated[str, typer.Argument(help="Source name.")],
    wait: WaitOption = 60.0,
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """List a source's tools again (an executor asks the source) and print them."""
    session = _session(token)
    listing = session.call("POST", f"{_path(name)}/listing")
    _finish_listing(session, name, listing, wait_s=wait, json_=json_, what="listing requested")


@app.command("list")
@friendly
def list_(json_: JsonOption = False, token: TokenOption = None) -> None:
    """Every source."""
    body = _session(token).call("GET", "/v1/sources")
    if json_:
        print_json(body)
        return
    states = body.get("listings", {})
    for source in body["sources"]:
        console.print(
            f"{source['name']}  {source['kind']}  tenant={source['tenant_id']}  "
            f"tools={states.get(source['name'], 'pending')}  {source['target']}",
            markup=False,
        )


@app.command("tools")
@friendly
def tools(
    name: Annotated[str, typer.Argument(help="Source name.")],
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """The tools (every schema version) a source registered, and how its listing stands."""
    body = _session(token).call("GET", _path(name))
    if json_:
        print_json(body["tools"])
        return
    listing = body.get("listing")
    if listing is not None and listing["state"] != "ready":
        problem = listing_problem(name, listing, waited_s=0)
        console.print(
            problem or f"{name}: listing pending since {listing['requested_at']}",
            markup=False,
            soft_wrap=True,
        )
    _print_tools(body["tools"])


@app.command("configure")
@friendly
def configure(
    name: Annotated[str, typer.Argument(help="Source name.")],
    tool: Annotated[str, typer.Argument(help="The tool's name on the source, or its tool id.")],
    allow: Annotated[
        list[str] | None,
        typer.Option("--allow", help="A result field clients may see (repeat; default kept)."),
    ] = None,
    result_validation: Annotated[
        str | None, typer.Option("--result-validation", help="strict (default) or coerce.")
    ] = None,
    sanitize: Annotated[
        list[str] | None,
        typer.Option(
            "--sanitize", help="PATH=ACTION (allow, escape, redact, reject); PATH may be *."
        ),
    ] = None,
    max_result_bytes: Annotated[
        int | None, typer.Option("--max-result-bytes", help="Largest result clients get.")
    ] = None,
    effect: Annotated[
        str | None,
        typer.Option(
            "--effect",
            help="What it does, as you vouch for it: read_only, state_change or "
            "external_side_effect (the default; the source's own hints never count).",
        ),
    ] = None,
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """Set one tool's result rules (replacing its previous ones) and, with --effect, the
    effect you vouch for, for every version. Only --effect: the rules are kept."""
    if effect is not None and effect not in EFFECTS:
        raise CliError(f"--effect takes one of {', '.join(EFFECTS)}, got {effect!r}")
    session = _session(token)
    tool_path = f"{_path(name)}/tools/{quote(tool, safe='')}"
    rules_given = (allow, result_validation, sanitize, max_result_bytes) != (None,) * 4
    body: dict[str, Any] = {}
    if rules_given or effect is None:
        rules = tool_rules(
            allow=allow,
            result_validation=result_validation or "strict",
            sanitize=sanitize,
            max_result_bytes=max_result_bytes,
        )
        body = session.call("PUT", f"{tool_path}/rules", json=rules.model_dump(mode="json"))
    if effect is not None:
        body = session.call("PUT", f"{tool_path}/effect", json={"effect": effect})
    if json_:
        print_json(body)
        return
    changed = [t for t in body["tools"] if tool in (t["remote_name"], t["tool_id"])]
    for found in changed:
        rules_now = found["result_rules"]
        console.print(f"{found['tool_id']}@{found['version']}  {found['effect']}", markup=False)
        console.print(f"  allow: {', '.join(found['redaction_allowlist'])}", markup=False)
        console.print(
            f"  result_validation: {rules_now['mode']}, sanitize: {len(rules_now['sanitize'])} "
            f"paths, max_result_bytes: {rules_now['max_bytes'] or 'fleet default'}",
            markup=False,
            soft_wrap=True,
        )


@app.command("remove")
@friendly
def remove(
    name: Annotated[str, typer.Argument(help="Source name.")],
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """Forget a source; its tools are marked removed."""
    body = _session(token).call("DELETE", _path(name))
    if json_:
        print_json(body)
        return
    console.print(f"{name}: removed", markup=False)
