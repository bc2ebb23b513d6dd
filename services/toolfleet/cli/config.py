"""Loading settings and minting tokens for the commands, with friendly errors."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

from pydantic import ValidationError

from toolfleet.cli.errors import CliError
from toolfleet.settings import FleetSettings

if TYPE_CHECKING:
    from toolfleet.auth.tokens import TokenIssuer

SettingsT = TypeVar("SettingsT", bound=FleetSettings)

#: Subject of the admin tokens the CLI mints for itself to call the API.
CLI_SUBJECT = "did:toolfleet:cli"
#: Admin tokens the CLI mints for one command live this long.
ADMIN_TOKEN_TTL_S = 300


def load_settings(cls: type[SettingsT]) -> SettingsT:
    """Settings from ``TOOLFLEET_*`` variables and ``.env``; bad values name the variable."""
    try:
        return cls()
    except ValidationError as exc:
        problems = [
            f"  TOOLFLEET_{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            if err["loc"]
            # A check across settings names its variables itself.
            else f"  {err['msg'].removeprefix('Value error, ')}"
            for err in exc.errors(include_url=False, include_input=False)
        ]
        raise CliError("invalid configuration:\n" + "\n".join(problems)) from None


def token_issuer(settings: FleetSettings) -> TokenIssuer:
    """The issuer from the configured key pair, or a :class:`CliError` saying what is missing."""
    # Imported here: ``toolfleet worker`` reads its settings through this module and
    # never signs a token (the key code is ~7 MB a worker would carry for days).
    from toolfleet.auth.tokens import TokenIssuer

    private, public = settings.jwt_private_key_file, settings.jwt_public_key_file
    if private is None or public is None:
        raise CliError(
            "no signing key configured: set TOOLFLEET_JWT_PRIVATE_KEY_FILE and "
            "TOOLFLEET_JWT_PUBLIC_KEY_FILE (after `toolfleet dev`, `source .toolfleet/dev.env`), "
            "or pass --token"
        )
    for path in (private, public):
        if not path.is_file():
            raise CliError(f"signing key file not found: {path}")
    try:
        return TokenIssuer.from_files(
            private, public, issuer=settings.jwt_issuer, audience=settings.jwt_audience
        )
    except (ValueError, TypeError):
        raise CliError(f"{public} is not a PEM public key") from None


def mint(
    settings: FleetSettings,
    *,
    tenant_id: str,
    agent_did: str,
    tool_id: str = "*",
    tool_version: str = "*",
    ttl_s: int = 3600,
    admin: bool = False,
) -> str:
    """A capability token signed with the configured private key."""
    issuer = token_issuer(settings)
    try:
        return issuer.issue(
            tenant_id=tenant_id,
            agent_did=agent_did,
            tool_id=tool_id,
            tool_version=tool_version,
            ttl_s=ttl_s,
            scopes=["admin"] if admin else None,
        )
    except (ValueError, TypeError):
        raise CliError(
            f"{settings.jwt_private_key_file} is not a usable PEM RSA private key"
        ) from None


def admin_token(settings: FleetSettings) -> str:
    """A short-lived admin token for the CLI's own calls to the API."""
    return mint(settings, tenant_id="*", agent_did=CLI_SUBJECT, ttl_s=ADMIN_TOKEN_TTL_S, admin=True)
