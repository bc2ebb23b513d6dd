"""``toolfleet keys rotate|list``: operator rotation of the token-signing keys."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from toolfleet.auth.grants import ensure_grant_key, rotate_grant_key
from toolfleet.auth.jwks import JwksError
from toolfleet.auth.rotation import DEFAULT_KEEP, KeyFiles, list_keys, rotate_keys
from toolfleet.cli.config import load_settings
from toolfleet.cli.errors import CliError, friendly
from toolfleet.cli.output import console, print_json
from toolfleet.errors import ToolfleetError
from toolfleet.settings import FleetSettings

app = typer.Typer(
    help="Token-signing keys (rotation, the published key set) and the fleet's grant key.",
    no_args_is_help=True,
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


@app.command("grant")
@friendly
def grant(
    path: Annotated[
        Path | None,
        typer.Argument(
            help="The key file [default: TOOLFLEET_GRANT_KEY_FILE].", show_default=False
        ),
    ] = None,
    rotate: Annotated[
        bool, typer.Option("--rotate", help="Sign with a new key; the previous one still verifies.")
    ] = False,
) -> None:
    """Create the fleet's grant key (mode 600) unless it exists.

    Policy, the executor, the validator and the API refuse to start without it
    (``TOOLFLEET_GRANT_KEY_FILE``): it signs every call's grant and every control event,
    and seals raw results at rest.
    """
    target = path or load_settings(FleetSettings).grant_key_file
    if target is None:
        raise CliError("name the key file: `toolfleet keys grant PATH`")
    target = target.expanduser().resolve()
    try:
        if rotate:
            rotate_grant_key(target)
            made = "rotated"
        else:
            made = "created" if ensure_grant_key(target) else "kept (it exists)"
    except OSError as exc:
        raise CliError(f"cannot write {target}: {exc.strerror or type(exc).__name__}") from None
    except ToolfleetError as exc:
        raise CliError(exc.message) from None
    for line in (f"grant key {made}: {target}", f"export TOOLFLEET_GRANT_KEY_FILE={target}"):
        console.print(line, soft_wrap=True, markup=False, highlight=False)  # copy-pasteable
