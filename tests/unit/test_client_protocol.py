"""Both clients have the one :class:`~toolfleet.client.Client` shape: same methods,
same signatures, same results; a transport's gap is a typed error, never a silence."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Callable
from typing import Any, cast

import httpx
import pytest

from toolfleet.client import (
    Client,
    HttpClient,
    InvocationEvent,
    InvocationHandle,
    KafkaClient,
    NotSupportedByTransport,
    Progress,
    connect_http,
)
from toolfleet.client.publisher import KafkaPublisher
from toolfleet.contract.progress import EventKind
from toolfleet.errors import PermissionDenied, ToolfleetError
from toolfleet.events.models import InvocationStatus, InvokeRequested, ToolOutcome
from toolfleet.events.types import EventType

pytestmark = pytest.mark.unit

OPERATIONS = ["invoke", "wait", "call", "events", "cancel", "approve", "deny", "status"]


def test_the_protocol_names_every_operation() -> None:
    public = {n for n in vars(Client) if not n.startswith("_")}
    assert public == set(OPERATIONS)


@pytest.mark.parametrize("operation", [*OPERATIONS, "__aenter__", "__aexit__"])
def test_both_clients_have_the_protocols_signature(operation: str) -> None:
    expected = inspect.signature(getattr(Client, operation))
    for cls in (HttpClient, KafkaClient):
        assert str(inspect.signature(getattr(cls, operation))) == str(expected), cls.__name__
    assert inspect.isasyncgenfunction(HttpClient.events)
    assert inspect.isasyncgenfunction(KafkaClient.events)


def test_both_clients_are_clients_at_runtime() -> None:
    http = connect_http("http://api.test", token="t", transport=httpx.MockTransport(_never))
    kafka = KafkaClient(cast(KafkaPublisher, object()), tenant_id="t1")
    assert isinstance(http, Client)
    assert isinstance(kafka, Client)


def _never(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"no request expected, got {request.method} {request.url}")


def _kafka() -> KafkaClient:
    # Nothing is published before a refusal: a publisher that is touched would fail.
    return KafkaClient(cast(KafkaPublisher, object()), tenant_id="t1")


@pytest.mark.parametrize(
    ("operation", "kwargs"),
    [
        ("status", {}),
        ("approve", {"reason": "ok", "parameters_hash": "a" * 64}),
        ("deny", {"reason": "no"}),
    ],
)
async def test_what_kafka_cannot_do_is_one_typed_error(
    operation: str, kwargs: dict[str, Any]
) -> None:
    method = getattr(_kafka(), operation)
    with pytest.raises(NotSupportedByTransport) as caught:
        await method(str(uuid.uuid4()), **kwargs)
    error = caught.value
    assert isinstance(error, ToolfleetError)
    assert (error.operation, error.transport) == (operation, "kafka")
    assert "connect_http" in error.message


async def test_a_kafka_client_invokes_only_for_its_tenant() -> None:
    with pytest.raises(PermissionDenied, match="tenant"):
        await _kafka().invoke("core__echo", tenant_id="someone_else", agent_did="did:agent:a")
    other = InvocationHandle(
        invocation_id=str(uuid.uuid4()), tenant_id="someone_else", event_id="", traceparent=""
    )
    with pytest.raises(PermissionDenied):
        await _kafka().wait(other, timeout=1)


async def test_http_events_follow_the_status_view_to_the_result() -> None:
    invocation_id = str(uuid.uuid4())
    answers = iter(
        [
            httpx.Response(404, json={"code": "not_found"}),
            httpx.Response(503, json={"detail": "blip"}),
            _view(invocation_id, "pending_approval"),
            _view(invocation_id, "running", latest_checkpoint={"c": 1}, progress_percent=40),
            _view(invocation_id, "success", progress_percent=100, result={"ok": True}),
        ]
    )
    reads: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        reads.append(request.url.path)
        return next(answers)

    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    handle = InvocationHandle(
        invocation_id=invocation_id, tenant_id="t1", event_id="", traceparent=""
    )
    async with HttpClient(
        "http://api.test", token="t", transport=httpx.MockTransport(handler), sleep=pause
    ) as client:
        events = [e async for e in client.events(handle)]
        outcome = await client.wait(handle, timeout=1)  # the terminal view, not read again
    assert events == [
        InvocationEvent(kind=EventKind.TOOL_CALL_START, invocation_id=invocation_id),
        InvocationEvent(kind=EventKind.APPROVAL_PENDING, invocation_id=invocation_id),
        InvocationEvent(kind=EventKind.PROGRESS, invocation_id=invocation_id, progress_percent=40),
        InvocationEvent(kind=EventKind.TOOL_CALL_RESULT, invocation_id=invocation_id),
    ]
    assert outcome.result == {"ok": True}
    assert len(reads) == 5
    assert pauses == [0.2] * 4


def _view(invocation_id: str, status: str, **extra: Any) -> httpx.Response:
    now = "2026-11-28T00:00:00+00:00"
    body = {
        "invocation_id": invocation_id,
        "tenant_id": "t1",
        "tool_id": "core__echo",
        "status": status,
        "created_at": now,
        "updated_at": now,
        **extra,
    }
    return httpx.Response(200, json=body)


class FakePublisher:
    """The broker side of a Kafka client: records what is published, lets the test
    deliver progress and the outcome as the watcher would."""

    def __init__(self) -> None:
        self.published: list[InvokeRequested] = []
        self.cancels: list[str] = []
        self.listeners: dict[str, Callable[[Progress], None]] = {}
        self.outcomes: dict[str, asyncio.Future[ToolOutcome]] = {}

    async def __aenter__(self) -> FakePublisher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def expect(
        self,
        invocation_id: str,
        *,
        tenant_id: str,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.outcomes.setdefault(invocation_id, asyncio.get_running_loop().create_future())
        if on_progress is not None:
            self.listeners[invocation_id] = on_progress

    async def publish(
        self, request: InvokeRequested, *, traceparent: str | None = None
    ) -> InvocationHandle:
        self.published.append(request)
        return InvocationHandle(
            invocation_id=str(request.invocation_id),
            tenant_id=request.agent_context.tenant_id,
            event_id="e1",
            traceparent=traceparent or "",
        )

    async def wait(self, handle: InvocationHandle) -> ToolOutcome:
        return await self.outcomes[handle.invocation_id]

    async def cancel(self, invocation_id: str, **_: Any) -> None:
        self.cancels.append(invocation_id)

    def progress(self, invocation_id: str, event_type: EventType, percent: float | None) -> None:
        self.listeners[invocation_id](
            Progress(
                invocation_id=invocation_id,
                event_type=event_type.value,
                progress_percent=percent,
                current_phase="half" if percent else "",
            )
        )

    def finish(self, invocation_id: str) -> None:
        self.outcomes[invocation_id].set_result(
            ToolOutcome(
                invocation_id=uuid.UUID(invocation_id),
                status=InvocationStatus.SUCCESS,
                agent_did="did:agent:a",
                tenant_id="t1",
                tool_id="core__echo",
                result={"ok": True},
            )
        )


async def test_a_kafka_client_keeps_every_event_of_its_calls_for_a_late_reader() -> None:
    broker = FakePublisher()
    async with KafkaClient(cast(KafkaPublisher, broker), tenant_id="t1", token="tok") as client:
        handle = await client.invoke(
            "core__echo", {"m": 1}, tenant_id="t1", agent_did="did:agent:a"
        )
        (request,) = broker.published
        assert request.capability_token == "tok"  # the client's token is the capability
        broker.progress(handle.invocation_id, EventType.INVOKED, None)  # not a client event
        broker.progress(handle.invocation_id, EventType.APPROVAL_REQUESTED, None)
        broker.progress(handle.invocation_id, EventType.CHECKPOINT_CREATED, 50.0)
        broker.finish(handle.invocation_id)

        outcome = await client.wait(handle, timeout=1)
        events = [e async for e in client.events(handle)]  # read after the end: nothing missed
        assert outcome.result == {"ok": True}
        iid = handle.invocation_id
        assert events == [
            InvocationEvent(kind=EventKind.TOOL_CALL_START, invocation_id=iid),
            InvocationEvent(kind=EventKind.APPROVAL_PENDING, invocation_id=iid),
            InvocationEvent(
                kind=EventKind.PROGRESS,
                invocation_id=iid,
                progress_percent=50.0,
                current_phase="half",
            ),
            InvocationEvent(kind=EventKind.TOOL_CALL_RESULT, invocation_id=iid),
        ]

        finished = await client.cancel(iid)
        assert (finished.cancelled, finished.message) == (
            False,
            "invocation already finished with status success",
        )
        assert broker.cancels == []
        running = await client.invoke("core__echo", tenant_id="t1", agent_did="did:agent:a")
        assert (await client.cancel(running.invocation_id)).cancelled
        assert broker.cancels == [running.invocation_id]
        with pytest.raises(TimeoutError):
            await client.wait(running, timeout=0)
