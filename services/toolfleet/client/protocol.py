"""``Client``: one shape for the fleet's users, whatever carries the calls.

Open one with :func:`~toolfleet.client.connect_http` (the HTTP API, a core install) or
:func:`~toolfleet.client.connect_kafka` (the broker, the ``fleet`` extra); both give a
``Client`` with the same methods, signatures and results, so code written against one
runs against the other (as HTTPX's one client runs over every transport):

- ``invoke`` returns an :class:`~toolfleet.client.InvocationHandle` once the transport
  has the call; ``wait`` and ``call`` return the :class:`~toolfleet.events.models.ToolOutcome`;
- ``events`` yields :class:`~toolfleet.contract.progress.InvocationEvent`: ``tool_call_start``,
  ``approval_pending``, ``progress``, and ``tool_call_result`` last;
- ``cancel`` returns a :class:`~toolfleet.contract.http.CancelResult` (``cancelled`` false
  for a call that had already finished);
- ``approve``/``deny`` return a :class:`~toolfleet.contract.http.DecisionResult`, and
  ``status`` the :class:`~toolfleet.contract.http.InvocationView`.

What a transport cannot do raises :class:`NotSupportedByTransport`, never a silent
difference. Over Kafka that is ``status``, ``approve`` and ``deny``: the status view is
the API's projection of the fleet, and deciding a call takes the API's checks (the
approver's scope, not the requester, bound to the parameters reviewed).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, Protocol, Self, Unpack, runtime_checkable

from toolfleet.client.handles import InvocationHandle
from toolfleet.client.requests import InvokeOptions
from toolfleet.contract.http import CancelResult, DecisionResult, InvocationView
from toolfleet.contract.progress import InvocationEvent
from toolfleet.errors import ToolfleetError
from toolfleet.events.models import ToolOutcome

__all__ = ["Client", "NotSupportedByTransport"]


class NotSupportedByTransport(ToolfleetError):
    """The client's transport cannot do this operation (raised before anything is sent);
    ``connect_http`` can do them all."""

    def __init__(self, operation: str, transport: str, why: str) -> None:
        super().__init__(
            f"{operation} is not supported over {transport}: {why}",
            details={"operation": operation, "transport": transport},
        )
        self.operation = operation
        self.transport = transport


@runtime_checkable
class Client(Protocol):
    """What a user of the fleet calls; :class:`~toolfleet.client.http.HttpClient` and
    :class:`~toolfleet.client.kafka.KafkaClient` implement it with identical signatures."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def invoke(
        self,
        tool_id: str,
        parameters: dict[str, Any] | None = None,
        **options: Unpack[InvokeOptions],
    ) -> InvocationHandle:
        """Submit a call; returns once the transport has it. ``options`` are
        :func:`~toolfleet.client.invoke_request`'s (``tenant_id`` and ``agent_did``
        required); without a ``capability_token`` the client's token is the capability."""
        ...

    async def wait(self, handle: InvocationHandle, *, timeout: float | None = None) -> ToolOutcome:
        """The call's terminal outcome. Raises ``TimeoutError`` after ``timeout`` seconds
        (the call goes on)."""
        ...

    async def call(
        self,
        tool_id: str,
        parameters: dict[str, Any] | None = None,
        *,
        timeout: float | None = None,
        **options: Unpack[InvokeOptions],
    ) -> ToolOutcome:
        """:meth:`invoke` then :meth:`wait`."""
        ...

    def events(self, handle: InvocationHandle) -> AsyncIterator[InvocationEvent]:
        """The call's life as it happens, ending after ``tool_call_result``."""
        ...

    async def cancel(self, invocation_id: str, *, reason: str = "") -> CancelResult:
        """Ask for a pending or running call to be cancelled (``cancelled`` false for a
        call that had already finished)."""
        ...

    async def approve(
        self, invocation_id: str, *, reason: str = "", parameters_hash: str | None = None
    ) -> DecisionResult:
        """Approve a call waiting in ``pending_approval``; with ``parameters_hash``, only
        the exact request that hash names. Raises :class:`NotSupportedByTransport` over Kafka."""
        ...

    async def deny(self, invocation_id: str, *, reason: str = "") -> DecisionResult:
        """Deny a call waiting in ``pending_approval``. Raises :class:`NotSupportedByTransport`
        over Kafka."""
        ...

    async def status(self, invocation_id: str) -> InvocationView | None:
        """The call's status view; None while the fleet does not know it (yet). Raises
        :class:`NotSupportedByTransport` over Kafka."""
        ...
