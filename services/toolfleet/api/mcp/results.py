"""What MCP clients see: registry manifests as MCP tools, invocations as tool results.

Pure mapping, no I/O. A call that ends answers with the tool's result as
``structuredContent`` plus the same JSON as text; a call that fails answers
``isError: true`` with the contract's error code and message. A call that needs
approval, or outlasts the server's wait, answers with a *handle*: the invocation id,
its status and the path to poll. Since a handle can stand where the tool's result
would, each tool's ``outputSchema`` is the registry's schema *or* the handle's.
"""

from __future__ import annotations

import json
from typing import Any, Final

import mcp_types as types

from toolfleet.api.credential import CloseReason
from toolfleet.api.problems import ProblemError
from toolfleet.contract.http import InvocationView
from toolfleet.contract.manifest import ToolManifest
from toolfleet.errors import ErrorCode
from toolfleet.events.models import InvocationStatus

HANDLE_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "title": "InvocationHandle",
    "description": "The call is not finished: poll its status with the same bearer token.",
    "properties": {
        "invocation_id": {"type": "string"},
        "status": {"type": "string", "enum": ["pending", "pending_approval", "queued", "running"]},
        "poll": {"type": "string", "description": "Path of GET /v1/invocations/{id}."},
    },
    "required": ["invocation_id", "status", "poll"],
}
"""``structuredContent`` of a call answered before it finished."""

_ROOT_KEYWORDS: Final = ("$defs", "definitions")
"""Keywords ``$ref`` resolves against the document root: they stay at the root."""

#: What a non-success status means when the outcome carries no error of its own.
_STATUS_ERRORS: Final[dict[InvocationStatus, tuple[str, str]]] = {
    InvocationStatus.CANCELLED: (ErrorCode.CANCELLED, "the invocation was cancelled"),
    InvocationStatus.TIMEOUT: (ErrorCode.TIMEOUT, "the invocation timed out"),
    InvocationStatus.PERMISSION_DENIED: (ErrorCode.PERMISSION_DENIED, "the call is not allowed"),
    InvocationStatus.ERROR: (ErrorCode.INTERNAL_ERROR, "the invocation failed"),
}


def mcp_tool(manifest: ToolManifest) -> types.Tool:
    """The MCP tool of a registered version: its id as name, its schemas."""
    return types.Tool(
        name=manifest.tool_id,
        description=manifest.description or None,
        input_schema=manifest.input_schema,
        output_schema=output_schema(manifest.output_schema),
    )


def output_schema(registered: dict[str, Any]) -> dict[str, Any]:
    """The registry's output schema or :data:`HANDLE_SCHEMA`, rooted at an object."""
    inner = {k: v for k, v in registered.items() if k not in (*_ROOT_KEYWORDS, "$schema")}
    root: dict[str, Any] = {k: registered[k] for k in _ROOT_KEYWORDS if k in registered}
    return {"type": "object", **root, "anyOf": [inner, HANDLE_SCHEMA]}


def finished_result(view: InvocationView) -> types.CallToolResult:
    """The answer to a call that ended: its result, or its typed error."""
    if view.status is InvocationStatus.SUCCESS:
        result = view.result or {}
        return types.CallToolResult(
            content=[types.TextContent(text=_json(result))], structured_content=result
        )
    error = dict(view.error or {})
    code, message = _STATUS_ERRORS.get(view.status, (ErrorCode.INTERNAL_ERROR, "failed"))
    error.setdefault("code", str(code))
    error.setdefault("message", message)
    return error_result(str(error["code"]), str(error["message"]), details=error)


def handle_result(
    invocation_id: str, status: InvocationStatus, *, status_url: str
) -> types.CallToolResult:
    """The answer to a call that has not finished (waiting for approval, or still running)."""
    handle = {
        "invocation_id": invocation_id,
        "status": status.value,
        "poll": f"/v1/invocations/{invocation_id}",
    }
    if status is InvocationStatus.PENDING_APPROVAL:
        text = f"Invocation {invocation_id} is waiting for approval; poll {status_url}"
    else:
        text = f"Invocation {invocation_id} is {status.value}; poll {status_url}"
    return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=handle)


def credential_result(invocation_id: str, reason: CloseReason) -> types.CallToolResult:
    """The answer to a call whose token was revoked or expired while it was followed.

    The invocation is not cancelled (policy and the executor refuse what a revoked
    token would still start); the caller only stops hearing about it.
    """
    message = f"stream closed: {reason.message}"
    return error_result(
        ErrorCode.PERMISSION_DENIED,
        message,
        details={
            "code": str(ErrorCode.PERMISSION_DENIED),
            "message": message,
            "reason": reason.value,
            "invocation_id": invocation_id,
        },
    )


def problem_result(problem: ProblemError) -> types.CallToolResult:
    """The answer to a call the API refused before publishing it."""
    return error_result(problem.code or ErrorCode.INTERNAL_ERROR, problem.detail)


def error_result(
    code: str, message: str, *, details: dict[str, Any] | None = None
) -> types.CallToolResult:
    """``isError: true`` with ``code: message`` as text and the error as structured data."""
    error = details if details is not None else {"code": code, "message": message}
    text = f"{code}: {message}"
    reasons = _field_errors(error.get("details"))
    if reasons:
        text += " (" + "; ".join(reasons) + ")"
    return types.CallToolResult(
        content=[types.TextContent(text=text)],
        structured_content={"error": error},
        is_error=True,
    )


def _field_errors(details: Any) -> list[str]:
    """The per-field reasons of a validation error (``details.errors``), for the model to
    correct its arguments by."""
    errors = details.get("errors") if isinstance(details, dict) else None
    if not isinstance(errors, list):
        return []
    return [
        f"{e.get('field', '/')}: {e['message']}"
        for e in errors
        if isinstance(e, dict) and isinstance(e.get("message"), str)
    ]


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), default=str)
