"""Commands that go through the HTTP API: ``status``, ``cancel``, ``approve``, ``deny``.

They authenticate with ``--token`` (or ``TOOLFLEET_TOKEN``), else with a short-lived admin
token minted from the configured private key; then they say so on stderr (every tenant,
admin scope), so nobody acts as admin without knowing it.
"""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import typer

from toolfleet.cli.config import ADMIN_TOKEN_TTL_S, CLI_SUBJECT, admin_token, load_settings
from toolfleet.cli.errors import CliError
from toolfleet.cli.output import console, err_console, print_invocation, print_json
from toolfleet.settings import FleetSettings

TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="TOOLFLEET_TOKEN",
        show_envvar=True,
        help="Bearer token for the API (default: an admin token minted from the private "
        "key, announced on stderr).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the API's JSON answer alone.")]
IdArgument = Annotated[str, typer.Argument(help="Invocation id.", show_default=False)]
ReasonOption = Annotated[str, typer.Option("--reason", help="Recorded in the audit trail.")]

HTTP_TIMEOUT_S = 10.0

ACTING_AS_ADMIN = (
    f"acting as admin ({CLI_SUBJECT}, every tenant): no --token or TOOLFLEET_TOKEN, so a "
    f"{ADMIN_TOKEN_TTL_S // 60}-minute admin token was minted from "
    "TOOLFLEET_JWT_PRIVATE_KEY_FILE"
)
"""Said on stderr whenever a command falls back to the admin identity."""


class ApiSession:
    """A small synchronous client of the status API with friendly errors."""

    def __init__(self, settings: FleetSettings, token: str | None) -> None:
        self._base = settings.api_url.rstrip("/")
        if token:
            self._token = token
        else:
            self._token = admin_token(settings)
            err_console.print(ACTING_AS_ADMIN, markup=False, soft_wrap=True, style="dim")

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """Send one request; a problem answer becomes a :class:`CliError`."""
        url = f"{self._base}{path}"
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        try:
            response = httpx.request(method, url, headers=headers, timeout=HTTP_TIMEOUT_S, **kwargs)
        except httpx.TransportError as exc:
            raise CliError(
                f"cannot reach the toolfleet API at {self._base} ({type(exc).__name__}); "
                "is `toolfleet api` or `toolfleet dev` running? (TOOLFLEET_API_URL)"
            ) from None
        if response.is_success:
            return response.json()
        raise CliError(_problem_message(response))


def _problem_message(response: httpx.Response) -> str:
    try:
        problem = response.json()
    except ValueError:
        problem = {}
    if not isinstance(problem, dict):
        problem = {}
    detail = problem.get("detail") or response.reason_phrase
    if response.status_code == 401:
        return f"the API refused the token: {detail}"
    if response.status_code == 404 and "/v1/invocations/" in str(response.request.url):
        return (
            "no such invocation for this token (another tenant's, or unknown; a call "
            "published straight to Kafka shows once the status projection has it)"
        )
    return f"{response.status_code} {problem.get('title') or response.reason_phrase}: {detail}"


def _session(token: str | None) -> ApiSession:
    return ApiSession(load_settings(FleetSettings), token)


def status(invocation_id: IdArgument, json_: JsonOption = False, token: TokenOption = None) -> None:
    """Show an invocation's status, progress and outcome."""
    view = _session(token).call("GET", f"/v1/invocations/{invocation_id}")
    if json_:
        print_json(view)
    else:
        print_invocation(view)


def cancel(
    invocation_id: IdArgument,
    reason: ReasonOption = "",
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """Ask for a pending or running invocation to be cancelled."""
    body = _session(token).call(
        "POST", f"/v1/invocations/{invocation_id}/cancel", json={"reason": reason}
    )
    if json_:
        print_json(body)
    else:
        console.print(body["message"], markup=False)


def _decide(
    invocation_id: str,
    verb: str,
    reason: str,
    json_: bool,
    token: str | None,
    parameters_hash: str | None = None,
) -> None:
    payload: dict[str, str] = {"reason": reason}
    if parameters_hash:
        payload["parameters_hash"] = parameters_hash
    body = _session(token).call("POST", f"/v1/invocations/{invocation_id}/{verb}", json=payload)
    if json_:
        print_json(body)
    else:
        console.print(body["message"], markup=False)


def approve(
    invocation_id: IdArgument,
    reason: ReasonOption = "",
    parameters_hash: Annotated[
        str | None,
        typer.Option(
            "--hash",
            help="The parameters_hash shown in approval.requested: approve that exact request.",
        ),
    ] = None,
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """Approve an invocation waiting for approval."""
    _decide(invocation_id, "approve", reason, json_, token, parameters_hash)


def deny(
    invocation_id: IdArgument,
    reason: ReasonOption = "",
    json_: JsonOption = False,
    token: TokenOption = None,
) -> None:
    """Deny an invocation waiting for approval."""
    _decide(invocation_id, "deny", reason, json_, token)
