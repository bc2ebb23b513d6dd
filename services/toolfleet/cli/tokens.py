"""``toolfleet token issue|revoke``: mint capability tokens, revoke them by ``jti``."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer

from toolfleet.auth.tokens import IssuedToken
from toolfleet.cli.config import load_settings, token_issuer
from toolfleet.cli.errors import CliError, friendly, reaching_fleet
from toolfleet.cli.output import err_console, print_json
from toolfleet.settings import FleetSettings

app = typer.Typer(help="Capability tokens.", no_args_is_help=True)

SCOPES = ("approver", "admin")
"""Scopes ``--scope`` accepts: ``approver`` decides its tenant's pending calls (never its
own), ``admin`` does everything for every tenant."""


@app.command("issue")
@friendly
def issue(
    tenant: Annotated[str, typer.Option("--tenant", help="Tenant id.", show_default=False)],
    agent: Annotated[str, typer.Option("--agent", help="Agent DID.", show_default=False)],
    tool: Annotated[
        str, typer.Option("--tool", help="Tool id or glob (core__*).", show_default=False)
    ],
    version: Annotated[str, typer.Option("--version", help="Version range.")] = "*",
    ttl: Annotated[int, typer.Option("--ttl", min=1, help="Lifetime in seconds.")] = 3600,
    admin: Annotated[
        bool, typer.Option("--admin", help="Add the admin scope (all tenants in the API).")
    ] = False,
    scope: Annotated[
        list[str] | None,
        typer.Option(
            "--scope",
            help="Add a scope (repeatable): approver (decide the tenant's pending calls) or admin.",
            show_default=False,
        ),
    ] = None,
    connection: Annotated[
        list[str] | None,
        typer.Option(
            "--connection",
            help="Connection id whose secrets the token grants (repeatable).",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print {token, jti, exp} as JSON.")
    ] = False,
) -> None:
    """Print a signed capability token, alone, on stdout."""
    scopes = sorted(set(scope or ()) | ({"admin"} if admin else set()))
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown:
        raise CliError(f"unknown scope {unknown[0]!r}; choose from {', '.join(SCOPES)}")
    settings = load_settings(FleetSettings)
    issuer = token_issuer(settings)
    try:
        issued: IssuedToken = issuer.mint(
            tenant_id=tenant,
            agent_did=agent,
            tool_id=tool,
            tool_version=version,
            ttl_s=ttl,
            scopes=scopes or None,
            connections=list(connection or []),
        )
    except (ValueError, TypeError):
        raise CliError(
            f"{settings.jwt_private_key_file} is not a usable PEM RSA private key"
        ) from None
    if as_json:
        print_json({"token": issued.token, "jti": issued.jti, "exp": issued.expires_at})
    else:
        typer.echo(issued.token)


@app.command("revoke")
@friendly
def revoke(
    jti: Annotated[str, typer.Argument(help="The token's jti (`token issue --json` prints it).")],
    ttl: Annotated[
        int | None,
        typer.Option(
            "--ttl",
            min=1,
            help="Remember the revocation this long (default TOOLFLEET_REVOCATION_TTL_S); "
            "at least the token's remaining lifetime.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Revoke a capability token by jti: policy refuses it from now on."""
    from toolfleet.storage.revocation import revocation_key  # the fleet extra (redis)

    settings = load_settings(FleetSettings)
    try:
        revocation_key(jti)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    ttl_s = ttl or settings.revocation_ttl_s
    with reaching_fleet(settings):
        asyncio.run(_revoke(settings, jti, ttl_s))
    err_console.print(f"revoked {jti} for {ttl_s} s")


async def _revoke(settings: FleetSettings, jti: str, ttl_s: int) -> None:
    from toolfleet.storage.redis import connect_redis
    from toolfleet.storage.revocation import RedisRevocationList

    redis = connect_redis(settings.redis_url, max_connections=2, wait_s=5.0)
    try:
        await RedisRevocationList(redis, max_ttl_s=max(ttl_s, settings.revocation_ttl_s)).revoke(
            jti, ttl_s=ttl_s
        )
    finally:
        await redis.aclose()
