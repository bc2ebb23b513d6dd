"""``HttpClient``: the :class:`~toolfleet.client.Client` over the HTTP API (core install:
httpx only). Open it with :func:`connect_http`.

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
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Self, Unpack
from uuid import UUID

import httpx

from toolfleet.client.handles import InvocationHandle
from toolfleet.client.requests import InvokeOptions, RequestPublisher, invoke_request
from toolfleet.contract.http import (
    CancelResult,
    DecisionResult,
    InvocationView,
    InvokeAccepted,
    view_outcome,
)
from toolfleet.contract.progress import EventKind, InvocationEvent, view_events
from toolfleet.errors import ToolfleetError
from toolfleet.events.models import InvokeRequested, ToolOutcome

if TYPE_CHECKING:
    from toolfleet.client.protocol import Client

__all__ = ["ApiError", "ApiUnavailable", "HttpClient", "connect_http"]

Sleep = Callable[[float], Awaitable[None]]

#: The longest wait the API grants per request (``Prefer: wait=N``, RFC 7240).
MAX_WAIT_S = 60

ENDED_KEPT = 256
"""Terminal views remembered: an outcome is final, so ``wait`` after ``events`` reads
nothing again."""


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


class HttpClient(RequestPublisher):
    """The :class:`~toolfleet.client.Client` over the HTTP API:
    ``async with connect_http(url, token=...) as client``.

    Args:
        base_url: the API's root, e.g. ``http://localhost:8080``.
        token: the bearer token (also the capability when a call names none).
        transport: the httpx transport (default: real HTTP); tests inject theirs.
        timeout_s: per-request timeout (a request asking the API to wait gets that
            wait on top).
        poll_interval_s: the pause between two reads of the status view while waiting
            or following ``events``.
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
        poll_interval_s: float = 0.2,
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
        self._poll_interval_s = poll_interval_s
        self._sleep = sleep
        self._clock = clock
        self._ended: OrderedDict[str, InvocationView] = OrderedDict()

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
        view = InvocationView.model_validate(body)
        if view.status.is_terminal:
            self._ended[invocation_id] = view
            while len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)
        return view

    async def _read(self, invocation_id: str) -> InvocationView | None:
        """The status view while following a call: None while the projection trails, or
        while the API has a blip (429, 503, unreachable): the call goes on, ask again."""
        try:
            return await self.status(invocation_id)
        except ApiUnavailable:
            return None

    async def wait(self, handle: InvocationHandle, *, timeout: float | None = None) -> ToolOutcome:
        """Poll the status view until the invocation is terminal; its outcome.

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
        """
        view = await self._terminal(handle.invocation_id, timeout, self._poll_interval_s)
        return view_outcome(view)

    async def _terminal(
        self, invocation_id: str, timeout: float | None, poll_interval_s: float
    ) -> InvocationView:
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            view = self._ended.get(invocation_id) or await self._read(invocation_id)
            if view is not None and view.status.is_terminal:
                return view
            pause = poll_interval_s
            if deadline is not None:
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise TimeoutError(f"invocation {invocation_id} did not finish in time")
                pause = min(pause, remaining)
            await self._sleep(pause)

    async def call(
        self,
        tool_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        **options: Unpack[InvokeOptions],
    ) -> ToolOutcome:
        """Invoke and return the outcome.

        One request when the call ends within ``min(timeout, 60)`` seconds (the API
        waits, ``Prefer: wait``); otherwise the invocation is polled until ``timeout``.
        ``options`` are :meth:`invoke`'s keywords (``tenant_id``, ``agent_did``, ...).

        Raises:
            TimeoutError: no outcome within ``timeout`` seconds (the call goes on).
        """
        deadline = None if timeout is None else self._clock() + timeout
        wait_s = MAX_WAIT_S if timeout is None else max(0, min(MAX_WAIT_S, math.floor(timeout)))
        request = invoke_request(tool_id, parameters, **options)
        answer = await self._submit(request, traceparent=options.get("traceparent"), wait_s=wait_s)
        if isinstance(answer, InvocationView) and answer.status.is_terminal:
            return view_outcome(answer)
        if isinstance(answer, InvocationView):
            invocation_id, interval_s = str(answer.invocation_id), self._poll_interval_s
        else:
            invocation_id = answer.invocation_id
            interval_s = answer.polling_info.poll_interval_ms / 1000
        remaining = None if deadline is None else max(0.0, deadline - self._clock())
        return view_outcome(await self._terminal(invocation_id, remaining, interval_s))

    async def events(self, handle: InvocationHandle) -> AsyncIterator[InvocationEvent]:
        """Follow the status view (as ``GET /v1/invocations/{id}/events`` does) until the
        invocation is terminal."""
        before: InvocationView | None = None
        while True:
            now = await self._read(handle.invocation_id)
            if now is not None:
                for kind in view_events(before, now):
                    yield _event(kind, now)
                if now.status.is_terminal:
                    return
                before = now
            await self._sleep(self._poll_interval_s)

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


def connect_http(
    base_url: str,
    *,
    token: str,
    transport: httpx.AsyncBaseTransport | None = None,
    timeout_s: float = 10.0,
    poll_interval_s: float = 0.2,
) -> HttpClient:
    """A :class:`~toolfleet.client.Client` over the HTTP API at ``base_url``; use it as
    ``async with connect_http(url, token=token) as client``.

    ``token`` is the bearer token (also the capability when a call names none);
    ``transport`` replaces real HTTP (tests hand it an :class:`httpx.ASGITransport` or
    :class:`httpx.MockTransport`).
    """
    return HttpClient(
        base_url,
        token=token,
        transport=transport,
        timeout_s=timeout_s,
        poll_interval_s=poll_interval_s,
    )


def _event(kind: EventKind, view: InvocationView) -> InvocationEvent:
    if kind is EventKind.PROGRESS:
        return InvocationEvent(
            kind=kind,
            invocation_id=str(view.invocation_id),
            progress_percent=view.progress_percent,
            current_phase=view.current_phase,
        )
    return InvocationEvent(kind=kind, invocation_id=str(view.invocation_id))


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


if TYPE_CHECKING:

    def _implements_the_protocol(client: HttpClient) -> Client:
        return client  # mypy checks the class against Client
