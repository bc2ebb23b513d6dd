"""``KafkaClient``: the :class:`~toolfleet.client.Client` over the broker (the ``fleet``
extra). Open it with :func:`connect_kafka`.

It publishes through a :class:`~toolfleet.client.publisher.KafkaPublisher` and hears
each call's events and outcome on the events and results topics. A call this client
invoked is followed from before it is published, so ``events`` and ``wait`` miss
nothing however late they are called; a call invoked elsewhere is followed from the
moment ``wait`` or ``events`` asks for it.

Like an HTTP token, a Kafka client acts for one tenant (``tenant_id``), and its
``token`` is the capability of a call that names none. ``status``, ``approve`` and
``deny`` raise :class:`~toolfleet.client.NotSupportedByTransport`: the status view is
the API's projection, and deciding a call takes the API's checks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, Unpack

from toolfleet.client.handles import InvocationHandle, Progress
from toolfleet.client.protocol import NotSupportedByTransport

if TYPE_CHECKING:
    from toolfleet.client.protocol import Client
from toolfleet.client.publisher import KafkaPublisher
from toolfleet.client.requests import InvokeOptions, invoke_request
from toolfleet.contract.http import CancelResult, DecisionResult, InvocationView
from toolfleet.contract.progress import EventKind, InvocationEvent
from toolfleet.errors import PermissionDenied
from toolfleet.events.models import ToolOutcome
from toolfleet.events.types import EventType, Source
from toolfleet.settings import FleetSettings

__all__ = ["KafkaClient", "connect_kafka"]

TRANSPORT = "kafka"

FINISHED_KEPT = 1024
"""Finished calls remembered (for a late ``events`` or ``cancel``), oldest forgotten first."""

_KINDS = {
    EventType.CHECKPOINT_CREATED.value: EventKind.PROGRESS,
    EventType.APPROVAL_REQUESTED.value: EventKind.APPROVAL_PENDING,
}


@dataclass(eq=False)
class _Followed:
    """One call's events so far and its outcome, heard from before it was published."""

    handle: InvocationHandle
    events: list[InvocationEvent] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    outcome: asyncio.Task[ToolOutcome] | None = None

    def add(self, event: InvocationEvent) -> None:
        self.events.append(event)
        self.changed.set()

    def hear(self, update: Progress) -> None:
        kind = _KINDS.get(update.event_type)
        if kind is EventKind.PROGRESS:
            self.add(
                InvocationEvent(
                    kind=kind,
                    invocation_id=update.invocation_id,
                    progress_percent=update.progress_percent,
                    current_phase=update.current_phase,
                )
            )
        elif kind is not None:
            self.add(InvocationEvent(kind=kind, invocation_id=update.invocation_id))

    def ended(self, task: asyncio.Task[ToolOutcome]) -> None:
        if not task.cancelled():
            self.add(
                InvocationEvent(
                    kind=EventKind.TOOL_CALL_RESULT, invocation_id=self.handle.invocation_id
                )
            )


class KafkaClient:
    """The :class:`~toolfleet.client.Client` over the broker:
    ``async with connect_kafka(settings, tenant_id=..., token=...) as client``.

    Args:
        publisher: the started publisher it sends through and listens with (watching).
        tenant_id: the tenant it acts for: invokes of another tenant are refused, and
            cancels are that tenant's.
        token: the capability of a call that names none.
        requested_by: who cancels, for the audit trail.
    """

    def __init__(
        self,
        publisher: KafkaPublisher,
        *,
        tenant_id: str,
        token: str | None = None,
        requested_by: str = "",
    ) -> None:
        self._publisher = publisher
        self._tenant_id = tenant_id
        self._token = token
        self._requested_by = requested_by
        self._followed: OrderedDict[str, _Followed] = OrderedDict()
        self._tasks: set[asyncio.Task[ToolOutcome]] = set()
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Self:
        await self._stack.__aenter__()
        await self._stack.enter_async_context(self._publisher)
        self._stack.push_async_callback(self._stop_following)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.__aexit__(exc_type, exc, tb)

    async def _stop_following(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # --- calls ----------------------------------------------------------------------

    async def invoke(
        self,
        tool_id: str,
        parameters: dict[str, Any] | None = None,
        **options: Unpack[InvokeOptions],
    ) -> InvocationHandle:
        """Publish a call; returns once the broker has acknowledged it."""
        if options["tenant_id"] != self._tenant_id:
            raise PermissionDenied(
                "agent_context.tenant_id does not match the client's tenant",
                details={"tenant_id": options["tenant_id"]},
            )
        if options.get("capability_token") is None and self._token is not None:
            options["capability_token"] = self._token
        request = invoke_request(tool_id, parameters, **options)
        invocation_id = str(request.invocation_id)
        # Followed before it is published: a fast call's events may beat the ack.
        followed = self._follow(
            InvocationHandle(
                invocation_id=invocation_id, tenant_id=self._tenant_id, event_id="", traceparent=""
            )
        )
        self._publisher.expect(invocation_id, tenant_id=self._tenant_id, on_progress=followed.hear)
        try:
            handle = await self._publisher.publish(request, traceparent=options.get("traceparent"))
        except BaseException:
            del self._followed[invocation_id]  # never published: nothing to follow
            raise
        followed.handle = handle
        self._start(followed)
        return handle

    async def wait(self, handle: InvocationHandle, *, timeout: float | None = None) -> ToolOutcome:
        """The call's terminal outcome, as the fleet signed it."""
        followed = self._following(handle)
        assert followed.outcome is not None
        return await asyncio.wait_for(asyncio.shield(followed.outcome), timeout)

    async def call(
        self,
        tool_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        **options: Unpack[InvokeOptions],
    ) -> ToolOutcome:
        """:meth:`invoke` then :meth:`wait`."""
        handle = await self.invoke(tool_id, parameters, **options)
        return await self.wait(handle, timeout=timeout)

    async def events(self, handle: InvocationHandle) -> AsyncIterator[InvocationEvent]:
        """The call's life from the events topic, ending after ``tool_call_result``."""
        followed = self._following(handle)
        seen = 0
        while True:
            while seen < len(followed.events):
                event = followed.events[seen]
                seen += 1
                yield event
                if event.kind is EventKind.TOOL_CALL_RESULT:
                    return
            followed.changed.clear()
            if seen == len(followed.events):
                await followed.changed.wait()

    async def cancel(self, invocation_id: str, *, reason: str = "") -> CancelResult:
        """Publish a cancel, signed with the fleet's grant key that opening the client
        required (policy refuses unsigned ones); a call this client saw finish is left
        alone (``cancelled`` false, as the API answers)."""
        followed = self._followed.get(invocation_id)
        ended = followed.outcome if followed is not None else None
        if ended is not None and ended.done() and not ended.cancelled() and not ended.exception():
            return CancelResult(
                invocation_id=invocation_id,
                cancelled=False,
                message=f"invocation already finished with status {ended.result().status.value}",
            )
        await self._publisher.cancel(
            invocation_id,
            tenant_id=self._tenant_id,
            requested_by=self._requested_by,
            reason=reason,
            traceparent=followed.handle.traceparent if followed is not None else None,
        )
        return CancelResult(
            invocation_id=invocation_id, cancelled=True, message="cancellation requested"
        )

    async def approve(
        self, invocation_id: str, *, reason: str = "", parameters_hash: str | None = None
    ) -> DecisionResult:
        raise NotSupportedByTransport("approve", TRANSPORT, _DECIDE_OVER_HTTP)

    async def deny(self, invocation_id: str, *, reason: str = "") -> DecisionResult:
        raise NotSupportedByTransport("deny", TRANSPORT, _DECIDE_OVER_HTTP)

    async def status(self, invocation_id: str) -> InvocationView | None:
        raise NotSupportedByTransport(
            "status", TRANSPORT, "the status view is the API's projection; use connect_http"
        )

    # --- following ------------------------------------------------------------------

    def _follow(self, handle: InvocationHandle) -> _Followed:
        followed = _Followed(handle=handle)
        followed.add(
            InvocationEvent(kind=EventKind.TOOL_CALL_START, invocation_id=handle.invocation_id)
        )
        self._followed[handle.invocation_id] = followed
        while len(self._followed) > FINISHED_KEPT:
            oldest = next(iter(self._followed.values()))
            if oldest.outcome is None or not oldest.outcome.done():
                break  # never forget a call still running
            self._followed.popitem(last=False)
        return followed

    def _start(self, followed: _Followed) -> None:
        task = asyncio.create_task(
            self._publisher.wait(followed.handle),
            name=f"toolfleet-client-wait-{followed.handle.invocation_id}",
        )
        followed.outcome = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(followed.ended)

    def _following(self, handle: InvocationHandle) -> _Followed:
        """The call as followed so far; one invoked elsewhere is followed from now on."""
        followed = self._followed.get(handle.invocation_id)
        if followed is None:
            if handle.tenant_id != self._tenant_id:
                raise PermissionDenied("the invocation is another tenant's")
            followed = self._follow(handle)
            self._publisher.expect(
                handle.invocation_id, tenant_id=self._tenant_id, on_progress=followed.hear
            )
            self._start(followed)
        return followed


_DECIDE_OVER_HTTP = (
    "deciding a call takes the API's checks (approver scope, not the requester, the "
    "reviewed parameters); use connect_http"
)


def connect_kafka(
    settings: FleetSettings,
    *,
    tenant_id: str,
    token: str | None = None,
    requested_by: str = "",
    source: Source | str = Source.CLIENT,
) -> KafkaClient:
    """A :class:`~toolfleet.client.Client` over the broker ``settings`` name; use it as
    ``async with connect_kafka(FleetSettings(), tenant_id=..., token=...) as client``.

    Waiting trusts only outcomes the fleet signed, so ``settings`` must name the grant
    key (``TOOLFLEET_GRANT_KEY_FILE``); without it opening refuses, saying so.
    """
    publisher = KafkaPublisher(settings, source=source, watch=True)
    return KafkaClient(publisher, tenant_id=tenant_id, token=token, requested_by=requested_by)


if TYPE_CHECKING:

    def _implements_the_protocol(client: KafkaClient) -> Client:
        return client  # mypy checks the class against Client
