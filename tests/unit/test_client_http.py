"""The producer client over HTTP, through its transport seam (an httpx MockTransport)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from toolfleet.client import (
    ApiError,
    ApiUnavailable,
    HttpClient,
    InvocationHandle,
    invoke_request,
)
from toolfleet.events.models import InvocationStatus

pytestmark = pytest.mark.unit

TOKEN = "eyJ.the-bearer.token"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def view(invocation_id: str, status: str, **extra: Any) -> dict[str, Any]:
    now = datetime.now(UTC).isoformat()
    return {
        "invocation_id": invocation_id,
        "tenant_id": "tenant_acme",
        "tool_id": "core__echo",
        "status": status,
        "created_at": now,
        "updated_at": now,
        **extra,
    }


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def client(handler: Callable[[httpx.Request], httpx.Response], clock: FakeClock) -> HttpClient:
    return HttpClient(
        "http://api.test/",
        token=TOKEN,
        transport=httpx.MockTransport(handler),
        poll_interval_s=0.25,
        sleep=clock.sleep,
        clock=clock,
    )


async def test_invoke_posts_the_request_and_wait_polls_until_terminal() -> None:
    seen: list[httpx.Request] = []
    statuses = iter(["404", "pending", "running", "success"])

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.method == "POST":
            body = json.loads(request.content)
            invocation_id = body["invocation_id"]
            return httpx.Response(
                202,
                json={
                    "invocation_id": invocation_id,
                    "status": "pending",
                    "polling_info": {
                        "status_url": f"http://api.test/v1/invocations/{invocation_id}",
                        "poll_interval_ms": 500,
                    },
                },
            )
        invocation_id = request.url.path.rsplit("/", 1)[-1]
        status = next(statuses)
        if status == "404":
            return httpx.Response(404, json={"title": "Not Found", "code": "not_found"})
        return httpx.Response(
            200, json=view(invocation_id, status, result={"message": "hi", "length": 2})
        )

    clock = FakeClock()
    async with client(handler, clock) as api:
        handle = await api.invoke(
            "core__echo", {"message": "hi"}, tenant_id="tenant_acme", agent_did="did:agent:a"
        )
        outcome = await api.wait(handle, timeout=10)

    post = seen[0]
    assert (post.method, post.url.path) == ("POST", "/v1/invocations")
    assert post.headers["Authorization"] == f"Bearer {TOKEN}"
    body = json.loads(post.content)
    assert body["tool_id"] == "core__echo"
    assert body["parameters"] == {"message": "hi"}
    assert body["agent_context"]["tenant_id"] == "tenant_acme"
    assert isinstance(handle, InvocationHandle)
    assert handle.invocation_id == body["invocation_id"]
    assert handle.tenant_id == "tenant_acme"
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result == {"message": "hi", "length": 2}
    assert clock.sleeps == [0.25, 0.25, 0.25]


async def test_a_traceparent_joins_the_callers_trace() -> None:
    headers: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        headers.append(request.headers.get("traceparent"))
        invocation_id = json.loads(request.content)["invocation_id"]
        return httpx.Response(
            202,
            json={
                "invocation_id": invocation_id,
                "polling_info": {"status_url": "http://api.test/x"},
            },
        )

    request = invoke_request("core__echo", tenant_id="t", agent_did="did:agent:a")
    async with client(handler, FakeClock()) as api:
        handle = await api.publish(request, traceparent=TRACEPARENT)
    assert headers == [TRACEPARENT]
    assert handle.traceparent == TRACEPARENT
    assert handle.invocation_id == str(request.invocation_id)


async def test_a_problem_answer_raises_with_its_code_and_never_the_token() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            403,
            json={
                "type": "urn:toolfleet:problem:permission_denied",
                "title": "Forbidden",
                "status": 403,
                "detail": "agent_context.tenant_id does not match the token's tenant",
                "code": "permission_denied",
            },
        )

    async with client(handler, FakeClock()) as api:
        with pytest.raises(ApiError) as caught:
            await api.invoke("core__echo", tenant_id="other", agent_did="did:agent:a")
    error = caught.value
    assert (error.status, error.problem_code, error.retryable) == (403, "permission_denied", False)
    assert "does not match the token's tenant" in error.message
    assert TOKEN not in repr(error.details) + error.message


@pytest.mark.parametrize("status", [429, 503])
async def test_overload_and_broker_outage_are_retryable(status: int) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, headers={"Retry-After": "2"}, json={"detail": "retry later"})

    async with client(handler, FakeClock()) as api:
        with pytest.raises(ApiUnavailable) as caught:
            await api.cancel(str(uuid.uuid4()), reason="stop")
    assert caught.value.retryable
    assert caught.value.retry_after_s == 2
    assert caught.value.to_error_info().retryable


async def test_an_unreachable_api_is_retryable() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    async with client(handler, FakeClock()) as api:
        with pytest.raises(ApiUnavailable, match="cannot reach the toolfleet API") as caught:
            await api.status(str(uuid.uuid4()))
    assert caught.value.status == 0


async def test_wait_gives_up_at_its_timeout() -> None:
    invocation_id = str(uuid.uuid4())

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=view(invocation_id, "running"))

    clock = FakeClock()
    handle = InvocationHandle(
        invocation_id=invocation_id, tenant_id="tenant_acme", event_id="", traceparent=""
    )
    async with client(handler, clock) as api:
        with pytest.raises(TimeoutError):
            await api.wait(handle, timeout=2)
    assert clock.now == 2.0
    assert clock.sleeps == [0.25] * 8


async def test_control_calls_name_the_invocation() -> None:
    invocation_id = str(uuid.uuid4())
    calls: list[tuple[str, dict[str, Any]]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        verb = request.url.path.rsplit("/", 1)[-1]
        calls.append((request.url.path, json.loads(request.content)))
        if verb == "cancel":
            return httpx.Response(
                200,
                json={"invocation_id": invocation_id, "cancelled": True, "message": "requested"},
            )
        decision = "approved" if verb == "approve" else "denied"
        return httpx.Response(
            200, json={"invocation_id": invocation_id, "decision": decision, "message": "ok"}
        )

    async with client(handler, FakeClock()) as api:
        assert (await api.cancel(invocation_id, reason="r")).cancelled
        assert (await api.approve(invocation_id, parameters_hash="a" * 64)).decision == "approved"
        assert (await api.deny(invocation_id)).decision == "denied"
    base = f"/v1/invocations/{invocation_id}"
    assert calls == [
        (f"{base}/cancel", {"reason": "r"}),
        (f"{base}/approve", {"reason": "", "parameters_hash": "a" * 64}),
        (f"{base}/deny", {"reason": ""}),
    ]


async def test_call_is_one_request_when_the_api_waits_for_the_outcome() -> None:
    posts: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        posts.append(request)
        body = json.loads(request.content)
        answer = view(body["invocation_id"], "success", result={"message": "\udc80"})
        return httpx.Response(200, content=json.dumps(answer).encode())

    clock = FakeClock()
    async with client(handler, clock) as api:
        outcome = await api.call(
            "core__echo", {"message": "\udc80"}, tenant_id="t", agent_did="did:agent:a", timeout=90
        )
    assert outcome.status is InvocationStatus.SUCCESS
    assert outcome.result == {"message": "\udc80"}
    (post,) = posts
    assert post.headers["Prefer"] == "wait=60"  # the longest wait the API grants
    assert b"\\udc80" in post.content  # a lone surrogate travels as an ASCII escape
    assert clock.sleeps == []


async def test_call_polls_when_the_outcome_takes_longer_than_the_wait() -> None:
    statuses = iter(["running", "success"])

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            invocation_id = json.loads(request.content)["invocation_id"]
            assert request.headers["Prefer"] == "wait=5"
            return httpx.Response(
                202,
                json={
                    "invocation_id": invocation_id,
                    "polling_info": {"status_url": "http://api.test/x", "poll_interval_ms": 200},
                },
            )
        return httpx.Response(200, json=view(request.url.path.rsplit("/", 1)[-1], next(statuses)))

    clock = FakeClock()
    async with client(handler, clock) as api:
        outcome = await api.call(
            "core__echo", {}, tenant_id="t", agent_did="did:agent:a", timeout=5.5
        )
    assert outcome.status is InvocationStatus.SUCCESS
    assert clock.sleeps == [0.2]
