"""``ToolfleetHttpClient``: the producer side over the HTTP API (core install: httpx only).

It publishes through ``POST /v1/invocations`` and reads the status view, so a producer
needs neither broker access nor the ``fleet`` extra. ``call`` asks the API to wait for
the outcome (``Prefer: wait=N``, the synchronous invoke): a call that ends within a
minute costs one request; a longer one is answered ``202`` and then polled. The
``transport=`` seam takes any :class:`httpx.AsyncBaseTransport`: tests hand it an
:class:`httpx.MockTransport`, or an :class:`httpx.ASGITransport` over the app itself.

A problem answer raises :class:`ApiError` (its ``code`` is the contract's error code
when one applies); a 429, a 503 or an unreachable API raises the retryable
:class:`ApiUnavailable`.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, ClassVar, Self, Unpack
from uuid import UUID

import httpx

from toolfleet.client.handles import InvocationHandle
from toolfleet.client.requests import InvokeOptions, RequestPublisher, invoke_request
from toolfleet.contract.http import CancelResult, DecisionResult, InvocationView, InvokeAccepted
from toolfleet.errors import ToolfleetError
from toolfleet.events.models import InvokeRequested

__all__ = ["ApiError", "ApiUnavailable", "ToolfleetHttpClient"]

Sleep = Callable[[float], Awaitable[None]]

#: The longest wait the API grants per request (``Prefer: wait=N``, RFC 7240).
MAX_WAIT_S = 60


class ApiError(ToolfleetError):
    """The API answered with a problem (RFC 9457); never carries the token."""

    def __init__(self, message: str, *, status: int, code: str | None) -> None:
        super().__init__(message, details={"status": status, "code": code})
        self.status = status
        """The HTTP status of the answer (0: no answer)."""
        self.problem_code = code
        """The problem's ``code`` (``invalid_parameters``, ``not_found``, ...), if any."""


class ApiUnavailable(ApiError):
    """The API is unreachable, overloaded (429) or cannot reach the broker (503)."""

    retryable: ClassVar[bool] = True


class ToolfleetHttpClient(RequestPublisher):
    """Async client of the HTTP API: ``async with ToolfleetHttpClient(url, token=...)``.

    Args:
        base_url: the API's root, e.g. ``http://localhost:8080``.
        token: the bearer token (also the capability when a call names none).
        transport: the httpx transport (default: real HTTP); tests inject theirs.
        timeout_s: per-request timeout (a request asking the API to wait gets that
            wait on top).
        sleep: how polling waits between polls; ``clock`` measures ``wait``'s
            timeout (tests inject a fake clock's pair).
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 10.0,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            transport=transport,
            timeout=timeout_s,
        )
        self._timeout_s = timeout_s
        self._sleep = sleep
        self._clock = clock

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # --- publishing -----------------------------------------------------------------

    async def publish(
        self, request: InvokeRequested, *, traceparent: str | None = None
    ) -> InvocationHandle:
        """Submit a prepared request; ``traceparent`` joins the caller's trace."""
        answer = await self._submit(request, traceparent=traceparent, wait_s=0)
        if isinstance(answer, InvocationView):  # the API was told to wait (async_mode false)
            invocation_id = str(answer.invocation_id)
        else:
            invocation_id = answer.invocation_id
        return self._handle(request, invocation_id, traceparent)

    async def _submit(
        self, request: InvokeRequested, *, traceparent: str | None, wait_s: int
    ) -> InvokeAccepted | InvocationView:
        """``202`` accepted, or ``200`` with the ended call when the API waited for it."""
        headers = {"Content-Type": "application/json"}
        if traceparent:
            headers["traceparent"] = traceparent
        if wait_s > 0:
            headers["Prefer"] = f"wait={wait_s}"
        status, body = await self._call(
            "POST",
            "/v1/invocations",
            # ASCII escapes: parameters may hold lone surrogates, which UTF-8 cannot.
            content=json.dumps(request.model_dump(mode="json")).encode(),
            headers=headers,
            timeout=self._timeout_s + wait_s,
        )
        if status == 200:
            return InvocationView.model_validate(body)
        return InvokeAccepted.model_validate(body)

    @staticmethod
    def _handle(
        request: InvokeRequested, invocation_id: str, traceparent: str | None
    ) -> InvocationHandle:
        return InvocationHandle(
            invocation_id=invocation_id,
            tenant_id=request.agent_context.tenant_id,
            event_id="",
            traceparent=traceparent or "",
        )

    async def cancel(self, invocation_id: str, *, reason: str = "") -> CancelResult:
        """Ask for a pending or running invocation to be cancelled."""
        _, body = await self._call(
            "POST", f"/v1/invocations/{UUID(invocation_id)}/cancel", json={"reason": reason}
        )
        return CancelResult.model_validate(body)

    async def approve(
        self, invocation_id: str, *, reason: str = "", parameters_hash: str | None = None
    ) -> DecisionResult:
        """Approve a call; with ``parameters_hash``, only the exact request that hash names."""
        payload: dict[str, str] = {"reason": reason}
        if parameters_hash:
            payload["parameters_hash"] = parameters_hash
        _, body = await self._call(
            "POST", f"/v1/invocations/{UUID(invocation_id)}/approve", json=payload
        )
        return DecisionResult.model_validate(body)

    async def deny(self, invocation_id: str, *, reason: str = "") -> DecisionResult:
        _, body = await self._call(
            "POST", f"/v1/invocations/{UUID(invocation_id)}/deny", json={"reason": reason}
        )
        return DecisionResult.model_validate(body)

    # --- reading and waiting --------------------------------------------------------

    async def status(self, invocation_id: str) -> InvocationView | None:
        """The invocation's status view; None while the API does not know it (yet)."""
        try:
            _, body = await self._call("GET", f"/v1/invocations/{UUID(invocation_id)}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return InvocationView.model_validate(body)

    async def wait(
        self,
        handle: InvocationHandle,
        *,
        timeout: float | None = None,
        poll_interval_s: float = 0.5,
    ) -> InvocationView:
        """Poll until the invocation is terminal; its view carries the outcome.

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
        """
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            view = await self.status(handle.invocation_id)  # None: the projection trails
            if view is not None and view.status.is_terminal:
                return view
            pause = poll_interval_s
            if deadline is not None:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise TimeoutError(f"invocation {handle.invocation_id} did not finish in time")
                pause = min(pause, remaining)
            await self._sleep(pause)

    async def call(
        self,
        tool_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        timeout: float = 60.0,
        **kwargs: Unpack[InvokeOptions],
    ) -> InvocationView:
        """Invoke and return the ended call's status view (``status``, ``result``, ...).

        One request when the call ends within ``min(timeout, 60)`` seconds (the API
        waits, ``Prefer: wait``); otherwise the invocation is polled until ``timeout``.
        ``kwargs`` are :meth:`invoke`'s keywords (``tenant_id``, ``agent_did``, ...).

        Raises:
            TimeoutError: no outcome within ``timeout`` seconds (the call goes on).
        """
        deadline = self._clock() + timeout
        wait_s = max(0, min(MAX_WAIT_S, math.floor(timeout)))
        request = invoke_request(tool_id, parameters, **kwargs)
        answer = await self._submit(request, traceparent=None, wait_s=wait_s)
        if isinstance(answer, InvocationView) and answer.status.is_terminal:
            return answer
        if isinstance(answer, InvocationView):
            handle = self._handle(request, str(answer.invocation_id), None)
            interval_s = 0.5
        else:
            handle = self._handle(request, answer.invocation_id, None)
            interval_s = answer.polling_info.poll_interval_ms / 1000
        return await self.wait(
            handle, timeout=max(0.0, deadline - self._clock()), poll_interval_s=interval_s
        )

    async def _call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        """The answer's status and JSON body; a problem answer raises :class:`ApiError`."""
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiUnavailable(
                f"cannot reach the toolfleet API ({type(exc).__name__})", status=0, code=None
            ) from None
        if response.is_success:
            return response.status_code, response.json()
        raise _problem(response)


def _problem(response: httpx.Response) -> ApiError:
    try:
        problem = response.json()
    except ValueError:
        problem = None
    if not isinstance(problem, dict):
        problem = {}
    detail = str(problem.get("detail") or response.reason_phrase)
    code = problem.get("code")
    code = str(code) if code is not None else None
    status = response.status_code
    cls = ApiUnavailable if status in (429, 503) else ApiError
    error = cls(f"{status} {detail}", status=status, code=code)
    retry_after = response.headers.get("Retry-After", "")
    if retry_after.isdigit():
        error.retry_after_s = float(retry_after)
    return error
