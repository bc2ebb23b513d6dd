"""The real fleet behind :class:`~toolfleet.agent.port.FleetPort`, over any
:class:`~toolfleet.client.Client`.

:class:`ClientFleet` submits with the client's ``invoke``, hears progress and approval
requests from its ``events`` and takes the outcome from ``wait``, so it runs the same
over either transport; two constructors say which:

- :class:`HttpFleet` over the HTTP API (:func:`~toolfleet.client.connect_http`, a core
  install, no broker access): the events come from following the status view;
- :class:`KafkaFleet` over the broker (:func:`~toolfleet.client.connect_kafka`, the
  ``fleet`` extra): the events come from the events topic as they are published.

Both read the run's catalog from the API (``GET /v1/tools``, then ``GET /v1/tools/{id}``
for the manifests), which answers with exactly the tools the token and its tenant's
policy allow.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self
from urllib.parse import quote

import httpx

from toolfleet.agent.port import (
    FleetEvent,
    FleetEventKind,
    FleetPort,
    OnFleetEvent,
    Submission,
    Submitted,
)
from toolfleet.agent.traces import current_traceparent
from toolfleet.client.handles import InvocationHandle
from toolfleet.client.http import ApiError, HttpClient
from toolfleet.client.protocol import Client
from toolfleet.contract.manifest import ToolManifest
from toolfleet.contract.progress import EventKind, InvocationEvent
from toolfleet.errors import (
    ErrorCode,
    ErrorInfo,
    ResourceExhausted,
    ToolfleetError,
    error_from,
)
from toolfleet.events.identity import trace_id_of
from toolfleet.events.models import ToolOutcome

if TYPE_CHECKING:
    from toolfleet.settings import FleetSettings

__all__ = ["ApiCatalog", "ClientFleet", "HttpFleet", "KafkaFleet"]

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


_FLEET_KINDS = {
    EventKind.APPROVAL_PENDING: FleetEventKind.APPROVAL_REQUESTED,
    EventKind.PROGRESS: FleetEventKind.PROGRESS,
}


@dataclass(kw_only=True)
class ClientFleet:
    """The fleet through one :class:`~toolfleet.client.Client`, as one agent (token,
    tenant, agent id) sees it. Open with :meth:`over` an open client, or with
    :class:`HttpFleet` / :class:`KafkaFleet`'s ``open``, which also open the client."""

    client: Client
    catalog_reader: ApiCatalog
    tenant_id: str
    agent_did: str
    _handles: dict[str, InvocationHandle] = field(default_factory=dict, repr=False)

    @classmethod
    @contextlib.asynccontextmanager
    async def over(
        cls,
        client: Client,
        *,
        api_url: str,
        token: str,
        tenant_id: str,
        agent_did: str,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> AsyncIterator[Self]:
        """``async with ClientFleet.over(client, api_url=..., token=..., ...)``: a fleet
        over an open client (left open); the catalog comes from the API at ``api_url``."""
        async with _api(api_url, transport) as http:
            yield cls(
                client=client,
                catalog_reader=ApiCatalog(http=http, token=token),
                tenant_id=tenant_id,
                agent_did=agent_did,
            )

    async def catalog(self) -> list[ToolManifest]:
        return await self.catalog_reader.manifests()

    async def submit(self, submission: Submission) -> Submitted:
        # Inside run_agent's turn span: the call joins the agent's trace (else a new one).
        traceparent = current_traceparent()
        try:
            handle = await self.client.invoke(
                submission.tool_id,
                submission.parameters,
                tenant_id=self.tenant_id,
                agent_did=self.agent_did,
                tool_version=submission.tool_version,
                idempotency_key=submission.idempotency_key,
                session_id=submission.session_id,
                traceparent=traceparent,
            )
        except ApiError as exc:
            raise _contract_error(exc) from None
        self._handles[handle.invocation_id] = handle
        return Submitted(invocation_id=handle.invocation_id, trace_id=trace_id_of(traceparent))

    async def outcome(
        self, submitted: Submitted, *, on_event: OnFleetEvent | None = None, timeout: float
    ) -> ToolOutcome:
        handle = self._handles.pop(submitted.invocation_id)
        async with asyncio.timeout(timeout):
            async for event in self.client.events(handle):
                heard = _fleet_event(event)
                if heard is not None and on_event is not None:
                    on_event(heard)
            return await self.client.wait(handle)


class HttpFleet(ClientFleet):
    """The fleet through its HTTP API (core install). Open with :meth:`open`."""

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
        sleep: Sleep = asyncio.sleep,
    ) -> AsyncIterator[Self]:
        """``async with HttpFleet.open(url, token=..., tenant_id=..., agent_did=...)``;
        ``sleep`` paces the status reads (tests inject theirs)."""
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                HttpClient(
                    base_url,
                    token=token,
                    transport=transport,
                    poll_interval_s=poll_interval_s,
                    sleep=sleep,
                )
            )
            yield await stack.enter_async_context(
                cls.over(
                    client,
                    api_url=base_url,
                    token=token,
                    tenant_id=tenant_id,
                    agent_did=agent_did,
                    transport=transport,
                )
            )


class KafkaFleet(ClientFleet):
    """The fleet through the broker (the ``fleet`` extra); the catalog still comes from
    the API. Open with :meth:`open`."""

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        settings: FleetSettings,
        *,
        api_url: str,
        token: str,
        tenant_id: str,
        agent_did: str,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> AsyncIterator[Self]:
        """``async with KafkaFleet.open(FleetSettings(), api_url=..., token=..., ...)``."""
        from toolfleet.client.kafka import connect_kafka  # the fleet extra: imported on use

        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(
                connect_kafka(settings, tenant_id=tenant_id, token=token)
            )
            yield await stack.enter_async_context(
                cls.over(
                    client,
                    api_url=api_url,
                    token=token,
                    tenant_id=tenant_id,
                    agent_did=agent_did,
                    transport=transport,
                )
            )


def _fleet_event(event: InvocationEvent) -> FleetEvent | None:
    """The client's event as the runner hears it (it announces starts and results itself)."""
    kind = _FLEET_KINDS.get(event.kind)
    if kind is None:
        return None
    return FleetEvent(
        kind=kind,
        invocation_id=event.invocation_id,
        progress_percent=event.progress_percent,
        current_phase=event.current_phase,
    )


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


if TYPE_CHECKING:

    def _implements_the_port(fleet: ClientFleet) -> FleetPort:
        return fleet  # mypy checks the fleet against FleetPort
