"""RFC 9457 problem details (``application/problem+json``) for every error the API returns.

Routes raise :class:`ProblemError`; :func:`install_problem_handlers` turns it, Starlette's
HTTP errors (unknown route, wrong method) and request validation errors into problem
documents. Validation problems list the failing fields, never the values sent: a body
may carry a capability token.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from toolfleet.api.responses import SafeJSONResponse
from toolfleet.errors import ErrorCode

log = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"
_TYPE_PREFIX = "urn:toolfleet:problem:"


class FieldError(BaseModel):
    """One field that failed validation."""

    field: str
    """Dotted location, e.g. ``body.agent_context.tenant_id`` or ``query.limit``."""
    message: str
    """What is wrong, without the value that was sent."""
    type: str
    """Pydantic's machine-readable error type, e.g. ``missing``."""


class Problem(BaseModel):
    """An RFC 9457 problem details document."""

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    """URI naming the problem type (``urn:toolfleet:problem:<code>``)."""
    title: str
    """Short summary of the problem type (the HTTP reason phrase for ``about:blank``)."""
    status: int
    """The HTTP status code."""
    detail: str = ""
    """Explanation of this occurrence; safe to show, never a token or a secret."""
    instance: str = ""
    """The request path this occurrence belongs to."""
    code: str | None = None
    """The contract's error code, when one applies (clients branch on it)."""
    errors: list[FieldError] | None = Field(default=None)
    """Field-level errors of a validation problem."""


class ProblemError(Exception):
    """Raised by routes and dependencies to answer with a problem document."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        code: ErrorCode | str | None = None,
        headers: dict[str, str] | None = None,
        extensions: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.code = str(code) if code is not None else None
        self.headers = headers or {}
        self.extensions = extensions or {}


def problem_response(
    request: Request,
    status: int,
    detail: str,
    *,
    code: str | None = None,
    errors: list[FieldError] | None = None,
    headers: Mapping[str, str] | None = None,
    extensions: dict[str, Any] | None = None,
) -> JSONResponse:
    """A ``application/problem+json`` response for ``request``."""
    problem = Problem(
        type=f"{_TYPE_PREFIX}{code}" if code else "about:blank",
        title=_title(status),
        status=status,
        detail=detail,
        instance=request.url.path,
        code=code,
        errors=errors,
        **(extensions or {}),
    )
    return SafeJSONResponse(
        problem.model_dump(mode="json", exclude_none=True),
        status_code=status,
        headers=headers,
        media_type=PROBLEM_CONTENT_TYPE,
    )


def field_errors(exc: RequestValidationError) -> list[FieldError]:
    """Field-level errors of a validation failure, without the input values."""
    return [
        FieldError(
            field=".".join(str(part) for part in err.get("loc", ())),
            message=str(err.get("msg", "invalid value")),
            type=str(err.get("type", "value_error")),
        )
        for err in exc.errors()
    ]


def install_problem_handlers(app: FastAPI) -> None:
    """Answer every error of ``app`` with a problem document."""

    async def on_problem(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ProblemError)
        return problem_response(
            request,
            exc.status,
            exc.detail,
            code=exc.code,
            headers=exc.headers,
            extensions=exc.extensions,
        )

    async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        detail = exc.detail if isinstance(exc.detail, str) else _title(exc.status_code)
        return problem_response(request, exc.status_code, detail, headers=exc.headers)

    async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return problem_response(
            request,
            422,
            "the request is invalid; see errors",
            code=ErrorCode.INVALID_PARAMETERS,
            errors=field_errors(exc),
        )

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        # The type only: an exception's message may carry data that must not leak.
        log.error("unhandled API error", extra={"exc_type": type(exc).__name__})
        return problem_response(
            request, 500, "an internal error occurred", code=ErrorCode.INTERNAL_ERROR
        )

    app.add_exception_handler(ProblemError, on_problem)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(Exception, on_unexpected)


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting problem answers of a route.

    FastAPI files them under ``application/json``; :func:`problem_media_types` moves them
    to ``application/problem+json`` once the schema is generated.
    """
    return {status: {"model": Problem, "description": _title(status)} for status in statuses}


def problem_media_types(schema: dict[str, Any]) -> dict[str, Any]:
    """Rewrite error responses of an OpenAPI document to ``application/problem+json``."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                if str(status).startswith(("4", "5")) and "application/json" in content:
                    content[PROBLEM_CONTENT_TYPE] = content.pop("application/json")
    return schema
