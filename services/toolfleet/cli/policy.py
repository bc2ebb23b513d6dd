"""``toolfleet policy apply|get``: tenant policies through the API (admin token).

``apply FILE`` takes a YAML or JSON policy file: with ``tenants:`` every tenant in it is
written; with ``--tenant T`` the file is one tenant's policy. Documents are validated
before anything is sent, so a typo in a field fails before any tenant changes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
import yaml
from pydantic import ValidationError

from toolfleet.cli.config import load_settings
from toolfleet.cli.errors import CliError, friendly
from toolfleet.cli.output import console, print_json
from toolfleet.cli.remote import ApiSession, JsonOption, TokenOption
from toolfleet.policy.documents import PolicyDocument, TenantPolicy, parse_text
from toolfleet.settings import FleetSettings

app = typer.Typer(help="Tenant policies (needs an admin token).", no_args_is_help=True)


def _path(tenant_id: str) -> str:
    return f"/v1/policies/{quote(tenant_id, safe='')}"


def read_policies(file: Path, tenant: str | None) -> dict[str, TenantPolicy]:
    """The tenant policies ``file`` holds, validated; a :class:`CliError` says what is wrong."""
    try:
        data = parse_text(file.read_text(), json_=file.suffix == ".json")
    except OSError as exc:
        raise CliError(f"cannot read {file}: {exc.strerror or type(exc).__name__}") from None
    except (ValueError, yaml.YAMLError) as exc:
        raise CliError(f"{file} is not valid YAML or JSON: {exc}") from None
    try:
        if tenant is not None:
            return {tenant: TenantPolicy.model_validate(data)}
        if not isinstance(data, dict) or "tenants" not in data:
            raise CliError(
                f"{file} has no `tenants:` mapping; pass --tenant T to apply a single "
                "tenant's policy"
            )
        return dict(PolicyDocument.model_validate(data).tenants)
    except ValidationError as exc:
        problems = [
            f"  {'.'.join(str(p) for p in err['loc']) or '(document)'}: {err['msg']}"
            for err in exc.errors(include_url=False, include_input=False)
        ]
        raise CliError(f"{file} is not a valid policy:\n" + "\n".join(problems)) from None


@app.command("apply")
@friendly
def apply(
    file: Annotated[Path, typer.Argument(help="YAML or JSON policy file.", show_default=False)],
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant", help="Apply FILE as this one tenant's policy.", show_default=False
        ),
    ] = None,
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """Write the file's tenant policies; print each tenant's new version."""
    policies = read_policies(file, tenant)
    if not policies:
        raise CliError(f"{file} names no tenants")
    session = ApiSession(load_settings(FleetSettings), token)
    applied: list[dict[str, Any]] = []
    for tenant_id, policy in policies.items():
        try:
            body = session.call("PUT", _path(tenant_id), json=policy.model_dump(mode="json"))
        except CliError as exc:
            done = ", ".join(f"{a['tenant_id']} (v{a['version']})" for a in applied)
            raise CliError(
                f"{tenant_id}: {exc.message}" + (f"\nalready applied: {done}" if done else "")
            ) from None
        applied.append(body)
        if not json_:
            console.print(f"{tenant_id}: version {body['version']}", markup=False)
            for warning in body.get("warnings", []):
                console.print(f"  warning: {warning}", markup=False)
    if json_:
        print_json(applied)


@app.command("get")
@friendly
def get(
    tenant: Annotated[str, typer.Argument(help='Tenant id, or "*".', show_default=False)],
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """Show a tenant's stored policy and its version."""
    body = ApiSession(load_settings(FleetSettings), token).call("GET", _path(tenant))
    if json_:
        print_json(body)
        return
    console.print(
        f"{body['tenant_id']}: version {body['version']}, updated {body['updated_at']} "
        f"by {body['updated_by']}",
        markup=False,
    )
    print_yaml(body["policy"])


def print_yaml(policy: dict[str, Any]) -> None:
    """The policy as YAML, as one would write it in a file (defaults left out)."""
    defaults = TenantPolicy().model_dump(mode="json")
    trimmed = {k: v for k, v in policy.items() if defaults.get(k, object()) != v}
    console.print(yaml.safe_dump(trimmed or {}, sort_keys=False).rstrip(), markup=False)
