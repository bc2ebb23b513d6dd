"""HTTP operations as tools: build the request, send it with httpx, type the answer.

Input fields go where the operation says (URL template, query, JSON body); the
connection's credentials go in the headers the source names. The host must be granted
by the call's network permissions, and is resolved once: the request goes to the
address that was checked (:func:`pin`), with the name kept for ``Host`` and TLS (SNI
and certificate), so DNS rebinding cannot swap the address between check and connect.
Status codes map to typed errors:

    2xx        the JSON answer (a non-object answer as ``{"value": ...}``); a body over
               the source's ``max_response_bytes`` is result_too_large, not retryable
    429, 503   external_api_error, retryable, ``retry_after_s`` from ``Retry-After``
    3xx, 4xx   external_api_error, not retryable (redirects are not followed)
    5xx        external_api_error, retryable
    network    external_api_error, retryable (a name that does not resolve, too)
"""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import httpx

from toolfleet.errors import (
    ExternalApiError,
    InvalidParameters,
    PermissionDenied,
    ResultTooLarge,
    ResultValidationFailed,
)
from toolfleet.isolation.egress import EgressGrant, IPAddress, Resolver, parse_host
from toolfleet.sources.declared import source_tool as source_tool
from toolfleet.sources.models import HttpOperation, SourceDefinition, SourceTool


class ExternalApiRefused(ExternalApiError):
    """The API refused the request (a 4xx other than 429): a retry cannot help."""

    retryable = False


def build_request(
    source: SourceDefinition,
    operation: HttpOperation,
    parameters: Mapping[str, Any],
    headers: Mapping[str, str],
) -> httpx.Request:
    """The request one call sends (no I/O)."""
    url = operation.url
    for name in operation.path:
        if name not in parameters:
            raise InvalidParameters(f"missing path parameter {name!r}")
        url = url.replace("{" + name + "}", quote(str(parameters[name]), safe=""))
    base = source.target if source.target.endswith("/") else source.target + "/"
    full = url if url.startswith(("http://", "https://")) else urljoin(base, url.lstrip("/"))
    query = {k: _query_value(parameters[k]) for k in operation.query if k in parameters}
    body = {k: parameters[k] for k in operation.body if k in parameters}
    request = httpx.Request(
        operation.method,
        full,
        params=query,
        json=body if operation.body else None,
        # Uncompressed: a small compressed body must not inflate past the size limit
        # in memory before it is counted.
        headers={"Accept-Encoding": "identity", **headers},
    )
    request.extensions["timeout"] = httpx.Timeout(source.timeout_s).as_dict()
    return request


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


async def check_host(
    request: httpx.Request,
    network_permissions: Iterable[str],
    tenant_id: str,
    resolver: Resolver,
) -> IPAddress:
    """The one address ``request`` may go to, or ``permission_denied``, as the egress
    proxy decides: the host must be granted, and a name is resolved once, to an address
    the grant may reach (public, or a non-public one an address entry names: a name
    alone never reaches loopback, private networks or cloud metadata).
    """
    parts = urlsplit(str(request.url))
    port = parts.port or (443 if parts.scheme == "https" else 80)
    details = {"host": parts.hostname or "", "port": port}
    grant = EgressGrant.from_permissions(
        invocation_id="", tenant_id=tenant_id, network_permissions=network_permissions
    )
    try:
        host = parse_host(parts.hostname or "")
    except ValueError:
        raise PermissionDenied("the operation's URL has no valid host", details=details) from None
    if not grant.admits(host, port):
        raise PermissionDenied(
            f"the token's network permissions do not grant {details['host']}:{port}",
            details=details,
        )
    addresses = await resolver.resolve(host) if isinstance(host, str) else (host,)
    if not addresses:
        raise ExternalApiError(
            f"{details['host']} could not be resolved", details=details, retry_after_s=1.0
        )
    reachable = grant.reachable(addresses, port)
    if not reachable:
        raise PermissionDenied(
            f"{details['host']} resolves only to addresses the grant does not name",
            details=details,
        )
    return reachable[0]


def pin(request: httpx.Request, address: IPAddress) -> None:
    """Send ``request`` to ``address``: the URL names the address, while ``Host`` (set
    when the request was built) and TLS (SNI, certificate check) keep the name."""
    name = request.url.host
    if request.url.scheme == "https":
        request.extensions["sni_hostname"] = name
    request.url = request.url.copy_with(host=str(address))


def retry_after(value: str | None, *, now: Callable[[], float] = time.time) -> float | None:
    """Seconds of a ``Retry-After`` header (delta seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now())


def result_of(tool: SourceTool, response: httpx.Response) -> dict[str, Any]:
    """The fleet result of one (read) answer; a failure status raises its typed error."""
    check_status(tool, response)
    return parse_body(tool, response.content)


def check_status(tool: SourceTool, response: httpx.Response) -> None:
    """Raise the typed error of a failure status (its body is never read)."""
    status = response.status_code
    details = {"source": tool.source, "operation": tool.remote_name, "status": status}
    if status in (429, 503):
        raise ExternalApiError(
            f"{tool.tool_id}: the API answered {status}",
            details=details,
            retry_after_s=retry_after(response.headers.get("retry-after")),
        )
    if 300 <= status < 500:  # redirects are not followed: a moved API needs its operator
        raise ExternalApiRefused(f"{tool.tool_id}: the API answered {status}", details=details)
    if not 200 <= status < 300:
        raise ExternalApiError(f"{tool.tool_id}: the API answered {status}", details=details)


def parse_body(tool: SourceTool, body: bytes) -> dict[str, Any]:
    if not body:
        return {}
    try:
        parsed = json.loads(body)
    except ValueError:
        raise ResultValidationFailed(
            f"{tool.tool_id}: the API answered with a body that is not JSON",
            details={"source": tool.source, "operation": tool.remote_name},
        ) from None
    return parsed if isinstance(parsed, dict) else {"value": parsed}


async def read_body(tool: SourceTool, response: httpx.Response, max_bytes: int) -> bytes:
    """The (decoded) body of a streamed answer, refused past ``max_bytes`` without
    reading further: a declared ``Content-Length`` over it is refused before any byte."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(tool, max_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(tool, max_bytes)
            chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise ExternalApiError(
            f"{tool.tool_id}: the answer broke off ({type(exc).__name__})", retry_after_s=1.0
        ) from None
    return b"".join(chunks)


def _too_large(tool: SourceTool, max_bytes: int) -> ResultTooLarge:
    return ResultTooLarge(
        f"{tool.tool_id}: the API answered with more than {max_bytes} bytes",
        details={
            "source": tool.source,
            "operation": tool.remote_name,
            "limit": "bytes",
            "max": max_bytes,
        },
    )


async def send(
    client: httpx.AsyncClient, request: httpx.Request, tool: SourceTool
) -> httpx.Response:
    """Send ``request`` (its body left unread: the caller streams it, then closes it);
    a transport failure is a retryable ``external_api_error``."""
    try:
        return await client.send(request, stream=True)
    except httpx.TimeoutException:
        raise ExternalApiError(
            f"{tool.tool_id}: the API did not answer in time", retry_after_s=1.0
        ) from None
    except httpx.HTTPError as exc:
        raise ExternalApiError(
            f"{tool.tool_id}: the API could not be reached ({type(exc).__name__})",
            retry_after_s=1.0,
        ) from None
