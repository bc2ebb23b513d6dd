"""``toolfleet keys rotate|list``: operator rotation of the token-signing keys."""

from __future__ import annotations

from typing import Annotated

import typer

from toolfleet.auth.jwks import JwksError
from toolfleet.auth.rotation import DEFAULT_KEEP, KeyFiles, list_keys, rotate_keys
from toolfleet.cli.config import load_settings
from toolfleet.cli.errors import CliError, friendly
from toolfleet.cli.output import console, print_json
from toolfleet.settings import FleetSettings

app = typer.Typer(
    help="Token-signing keys: rotation and the published key set.", no_args_is_help=True
)


def _files() -> KeyFiles:
    settings = load_settings(FleetSettings)
    try:
        return KeyFiles.from_settings(settings)
    except ValueError:
        raise CliError(
            "no signing key configured: set TOOLFLEET_JWT_PRIVATE_KEY_FILE "
            "(after `toolfleet dev`, `source .toolfleet/dev.env`)"
        ) from None


@app.command("rotate")
@friendly
def rotate(
    keep: Annotated[
        int, typer.Option("--keep", min=2, max=10, help="Published keys to keep, new one included.")
    ] = DEFAULT_KEEP,
    bits: Annotated[int, typer.Option("--bits", min=2048, max=8192, help="RSA key size.")] = 2048,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Generate a new signing key; tokens of the previous keys keep verifying."""
    files = _files()
    try:
        result = rotate_keys(files, keep=keep, bits=bits)
    except (JwksError, ValueError, TypeError):
        raise CliError(
            f"the current keys in {files.private.parent} are unusable (PEM RSA keys and a "
            "JWKS expected); nothing was changed"
        ) from None
    except OSError as exc:
        raise CliError(f"cannot write the keys: {exc.strerror or type(exc).__name__}") from None
    if as_json:
        print_json(
            {
                "kid": result.kid,
                "previous_kid": result.previous_kid,
                "published": list(result.published),
                "retired": list(result.retired),
                "jwks_file": str(files.jwks),
            }
        )
        return
    console.print(f"new signing key [bold]{result.kid}[/]")
    console.print(f"published in {files.jwks} and {files.public}: {', '.join(result.published)}")
    if result.retired:
        console.print(f"retired (their tokens no longer verify): {', '.join(result.retired)}")


@app.command("list")
@friendly
def list_(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Show the published key ids, newest first; ``*`` marks the signing key."""
    files = _files()
    try:
        keys = list_keys(files)
    except (JwksError, ValueError, TypeError):
        raise CliError(f"the keys in {files.private.parent} are unusable") from None
    if as_json:
        print_json([{"kid": k.kid, "signing": k.signing} for k in keys])
        return
    for key in keys:
        console.print(f"{'*' if key.signing else ' '} {key.kid}")
