"""The real fleet behind :class:`~toolfleet.agent.fleet.FleetPort`, over either transport.

- :class:`HttpFleet` goes through the HTTP API with :class:`ToolfleetHttpClient` (a core
  install, no broker access): it submits, then follows the status view, whose changes
  become progress and approval events.
- :class:`KafkaFleet` publishes with :class:`ToolfleetClient` (the ``fleet`` extra) and
  hears progress and approval requests on the events topic as they are published.

Both read the run's catalog from the API (``GET /v1/tools``, then ``GET /v1/tools/{id}``
for the manifests), which answers with exactly the tools the token and its tenant's
policy allow.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from toolfleet.agent.fleet import (
    FleetEvent,
    FleetEventKind,
    FleetPort,
    OnFleetEvent,
    Submission,
    Submitted,
)
from toolfleet.client.handles import InvocationHandle, Progress
from toolfleet.client.http import ApiError, ApiUnavailable, ToolfleetHttpClient
from toolfleet.client.requests import invoke_request
from toolfleet.contract.manifest import ToolManifest
from toolfleet.contract.progress import EventKind, view_events
from toolfleet.errors import (
    ErrorCode,
    ErrorInfo,
    ResourceExhausted,
    ToolfleetError,
    error_from,
)
from toolfleet.events.identity import new_traceparent, trace_id_of
from toolfleet.events.models import ExecutionMetadata, ToolOutcome
from toolfleet.events.types import EventType

if TYPE_CHECKING:
    from toolfleet.client.kafka import ToolfleetClient
    from toolfleet.contract.http import InvocationView

__all__ = ["ApiCatalog", "HttpFleet", "KafkaFleet"]

PAGE_SIZE = 200
Sleep = Callable[[float], Awaitable[None]]


@dataclass(kw_only=True)
class ApiCatalog:
    """Reads the policy-filtered catalog from the API with one agent's token."""

    http: httpx.AsyncClient
    """Pointed at the API (``base_url``)."""
    token: str = field(repr=False)

    async def manifests(self) -> list[ToolManifest]:
        headers = {"Authorization": f"Bearer {self.token}"}
        ids: list[str] = []
        page = 1
        while True:
            answer = await self.http.get(
                "/v1/tools", params={"page": page, "page_size": PAGE_SIZE}, headers=headers
            )
            answer.raise_for_status()
            body: dict[str, Any] = answer.json()
            ids += [str(item["tool_id"]) for item in body["items"]]
            if page * PAGE_SIZE >= int(body["total"]):
                break
            page += 1
        manifests: list[ToolManifest] = []
        for tool_id in ids:
            detail = await self.http.get(f"/v1/tools/{quote(tool_id, safe='')}", headers=headers)
            detail.raise_for_status()
            manifests += [ToolManifest.model_validate(v) for v in detail.json()["versions"]]
        return manifests


@contextlib.asynccontextmanager
async def _api(
    base_url: str, transport: httpx.AsyncBaseTransport | None
) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=base_url.rstrip("/"), transport=transport, timeout=10.0
    ) as http:
        yield http


# --- HTTP ----------------------------------------------------------------------------


@dataclass(kw_only=True)
class HttpFleet:
    """The fleet through its HTTP API. Open with :meth:`open`."""

    client: ToolfleetHttpClient
    catalog_reader: ApiCatalog
    tenant_id: str
    agent_did: str
    poll_interval_s: float = 0.2
    sleep: Sleep = asyncio.sleep
    _handles: dict[str, InvocationHandle] = field(default_factory=dict, repr=False)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        base_url: str,
        *,
        token: str,
        tenant_id: str,
        agent_did: str,
        transport: httpx.AsyncBaseTransport | None = None,
        poll_interval_s: float = 0.2,
    ) -> AsyncIterator[HttpFleet]:
        """``async with HttpFleet.open(url, token=..., tenant_id=..., agent_did=...)``."""
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                ToolfleetHttpClient(base_url, token=token, transport=transport)
            )
            http = await stack.enter_async_context(_api(base_url, transport))
            yield cls(
                client=client,
                catalog_reader=ApiCatalog(http=http, token=token),
                tenant_id=tenant_id,
                agent_did=agent_did,
                poll_interval_s=poll_interval_s,
            )

    async def catalog(self) -> list[ToolManifest]:
        return await self.catalog_reader.manifests()

    async def submit(self, submission: Submission) -> Submitted:
        traceparent = new_traceparent()
        request = invoke_request(
            submission.tool_id,
            submission.parameters,
            tenant_id=self.tenant_id,
            agent_did=self.agent_did,
            tool_version=submission.tool_version,
            idempotency_key=submission.idempotency_key,
            session_id=submission.session_id,
        )
        try:
            handle = await self.client.publish(request, traceparent=traceparent)
        except ApiError as exc:
            raise _contract_error(exc) from None
        self._handles[handle.invocation_id] = handle
        return Submitted(invocation_id=handle.invocation_id, trace_id=trace_id_of(traceparent))

    async def outcome(
        self, submitted: Submitted, *, on_event: OnFleetEvent | None = None, timeout: float
    ) -> ToolOutcome:
        self._handles.pop(submitted.invocation_id, None)
        before: InvocationView | None = None
        async with asyncio.timeout(timeout):
            while True:
                try:
                    view = await self.client.status(submitted.invocation_id)  # None: not yet
                except ApiUnavailable:
                    view = None  # a blip of the API: the call goes on, ask again
                if view is not None:
                    if on_event is not None:
                        for event in _changes(before, view):
                            on_event(event)
                    if view.status.is_terminal:
                        return _outcome_of(view)
                    before = view
                await self.sleep(self.poll_interval_s)


def _changes(before: InvocationView | None, now: InvocationView) -> list[FleetEvent]:
    """What a change of the status view means as fleet events."""
    found = []
    for kind in view_events(before, now):
        if kind is EventKind.APPROVAL_PENDING:
            found.append(
                FleetEvent(
                    kind=FleetEventKind.APPROVAL_REQUESTED, invocation_id=str(now.invocation_id)
                )
            )
        elif kind is EventKind.PROGRESS:
            found.append(
                FleetEvent(
                    kind=FleetEventKind.PROGRESS,
                    invocation_id=str(now.invocation_id),
                    progress_percent=now.progress_percent,
                    current_phase=now.current_phase,
                )
            )
    return found


def _contract_error(exc: ApiError) -> ToolfleetError:
    """The API's problem as the contract error it names (``internal_error`` otherwise),
    keeping whether a retry may help."""
    codes = {c.value for c in ErrorCode}
    code = exc.problem_code if exc.problem_code in codes else ErrorCode.INTERNAL_ERROR.value
    error = error_from(
        ErrorInfo(code=ErrorCode(code), message=exc.message, retry_after_s=exc.retry_after_s)
    )
    if exc.retryable and not error.retryable:
        return ResourceExhausted(exc.message, retry_after_s=exc.retry_after_s)
    return error


def _outcome_of(view: InvocationView) -> ToolOutcome:
    return ToolOutcome(
        invocation_id=view.invocation_id,
        status=view.status,
        agent_did=view.agent_did or "",
        tenant_id=view.tenant_id,
        tool_id=view.tool_id,
        tool_version=view.tool_version,
        result=view.result,
        error=ErrorInfo.model_validate(view.error) if view.error else None,
        warnings=view.warnings,
        execution_metadata=ExecutionMetadata.model_validate(view.execution_metadata or {}),
    )


# --- Kafka ---------------------------------------------------------------------------

_KINDS = {
    EventType.INVOKED.value: FleetEventKind.INVOKED,
    EventType.CHECKPOINT_CREATED.value: FleetEventKind.PROGRESS,
    EventType.APPROVAL_REQUESTED.value: FleetEventKind.APPROVAL_REQUESTED,
}


@dataclass(kw_only=True)
class KafkaFleet:
    """The fleet through the broker: one agent's view (token, tenant, agent id).

    The :class:`ToolfleetClient` is the process's, shared by every run; the catalog
    still comes from the API.
    """

    client: ToolfleetClient
    catalog_reader: ApiCatalog
    token: str = field(repr=False)
    tenant_id: str
    agent_did: str
    _handles: dict[str, InvocationHandle] = field(default_factory=dict, repr=False)

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        client: ToolfleetClient,
        *,
        api_url: str,
        token: str,
        tenant_id: str,
        agent_did: str,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> AsyncIterator[KafkaFleet]:
        """``async with KafkaFleet.open(client, api_url=..., token=..., ...)``."""
        async with _api(api_url, transport) as http:
            yield cls(
                client=client,
                catalog_reader=ApiCatalog(http=http, token=token),
                token=token,
                tenant_id=tenant_id,
                agent_did=agent_did,
            )

    async def catalog(self) -> list[ToolManifest]:
        return await self.catalog_reader.manifests()

    async def submit(self, submission: Submission) -> Submitted:
        handle = await self.client.invoke(
            submission.tool_id,
            submission.parameters,
            tenant_id=self.tenant_id,
            agent_did=self.agent_did,
            tool_version=submission.tool_version,
            capability_token=self.token,
            idempotency_key=submission.idempotency_key,
            session_id=submission.session_id,
        )
        self._handles[handle.invocation_id] = handle
        return Submitted(
            invocation_id=handle.invocation_id, trace_id=trace_id_of(handle.traceparent)
        )

    async def outcome(
        self, submitted: Submitted, *, on_event: OnFleetEvent | None = None, timeout: float
    ) -> ToolOutcome:
        handle = self._handles.pop(submitted.invocation_id)

        def progress(update: Progress) -> None:
            kind = _KINDS.get(update.event_type)
            if kind is not None and on_event is not None:
                on_event(
                    FleetEvent(
                        kind=kind,
                        invocation_id=update.invocation_id,
                        progress_percent=update.progress_percent,
                        current_phase=update.current_phase,
                    )
                )

        return await self.client.wait(handle, timeout=timeout, on_progress=progress)


if TYPE_CHECKING:

    def _implements_the_port(http: HttpFleet, kafka: KafkaFleet) -> tuple[FleetPort, ...]:
        return (http, kafka)  # mypy checks both against FleetPort
