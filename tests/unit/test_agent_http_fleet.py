"""``HttpFleet`` against a scripted API (``httpx.MockTransport``): what the runner sees."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from tests.support.agent_fixtures import EchoIn, manifest
from toolfleet.agent import AgentEvent, EventKind, HttpFleet, ToolRunner
from toolfleet.agent.adapters import parse_call

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 24, tzinfo=UTC).isoformat()
ATTACHMENT = "/v1/invocations/x/attachments/y"


def _view(invocation_id: str, status: str, **fields: Any) -> dict[str, Any]:
    return {
        "invocation_id": invocation_id,
        "tenant_id": "t1",
        "agent_did": "did:agent:http",
        "tool_id": "core__echo",
        "tool_version": "1.0.0",
        "status": status,
        "created_at": NOW,
        "updated_at": NOW,
        **fields,
    }


class ScriptedApi:
    """The API's answers, in order, for one invocation."""

    def __init__(self) -> None:
        self.posted: list[tuple[dict[str, Any], dict[str, str]]] = []
        self.invocation_id = str(uuid.uuid4())
        self.views: Iterator[dict[str, Any] | str | None] = iter(
            [
                None,  # the projection trails the publish
                "unavailable",  # the API has a blip
                _view(self.invocation_id, "pending_approval", current_phase="awaiting_approval"),
                _view(self.invocation_id, "running", current_phase="authorized"),
                _view(
                    self.invocation_id,
                    "running",
                    progress_percent=50,
                    current_phase="half",
                    latest_checkpoint={"checkpoint_id": "cp1"},
                ),
                _view(
                    self.invocation_id,
                    "success",
                    progress_percent=100,
                    result={"value": "hel…"},
                    execution_metadata={
                        "duration_ms": 12,
                        "truncated": True,
                        "attachments": [
                            {"url": ATTACHMENT, "content_type": "application/json", "bytes": 9}
                        ],
                    },
                ),
            ]
        )

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == "Bearer tok"
        path = request.url.path
        if path == "/v1/tools":
            return httpx.Response(200, json={"items": [{"tool_id": "core__echo"}], "total": 1})
        if path == "/v1/tools/core__echo":
            body = {"versions": [manifest("core__echo", EchoIn).model_dump(mode="json")]}
            return httpx.Response(200, json=body)
        if request.method == "POST" and path == "/v1/invocations":
            self.posted.append((json.loads(request.content), dict(request.headers)))
            accepted = {
                "invocation_id": self.invocation_id,
                "status": "pending",
                "polling_info": {"status_url": f"http://api/v1/invocations/{self.invocation_id}"},
            }
            return httpx.Response(202, json=accepted)
        view = next(self.views)
        if view == "unavailable":
            return httpx.Response(503, json={"title": "Service Unavailable", "detail": "retry"})
        if view is None:
            return httpx.Response(404, json={"title": "Not Found", "detail": "no such invocation"})
        assert isinstance(view, dict)
        return httpx.Response(200, json=view)


async def test_a_call_over_http_reports_approval_progress_and_a_truncated_result() -> None:
    api = ScriptedApi()
    pauses: list[float] = []

    async def pause(seconds: float) -> None:
        pauses.append(seconds)

    async with HttpFleet.open(
        "http://api",
        token="tok",
        tenant_id="t1",
        agent_did="did:agent:http",
        transport=httpx.MockTransport(api),
        sleep=pause,
    ) as fleet:
        runner = await ToolRunner.open(fleet, run_id="http-run")
        events: list[AgentEvent] = []
        runner.subscribe(events.append)
        (envelope,) = await runner.run_turn(
            0, [parse_call("c1", "core__echo", '{"message": "hello"}')]
        )

    ((body, headers),) = api.posted
    assert body["execution_options"]["idempotency_key"] == envelope.call_id
    assert body["tool_version"] == "1.0.0"
    assert body["agent_context"] == {
        "agent_did": "did:agent:http",
        "tenant_id": "t1",
        "user_did": None,
        "session_id": "http-run",
    }
    assert envelope.trace_id is not None
    assert headers["traceparent"].split("-")[1] == envelope.trace_id
    assert [e.kind for e in events] == [
        EventKind.TOOL_CALL_START,
        EventKind.APPROVAL_PENDING,
        EventKind.PROGRESS,
        EventKind.TOOL_CALL_RESULT,
    ]
    assert events[2].progress_percent == 50
    assert envelope.ok
    assert envelope.truncated
    assert envelope.attachments == [ATTACHMENT]
    assert envelope.output == {"value": "hel…"}
    assert envelope.runtime_ms == 12
    assert len(pauses) == 5  # one per read that found the call unfinished


async def test_a_call_the_api_refuses_is_an_error_result_with_its_code() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/tools":
            return httpx.Response(200, json={"items": [{"tool_id": "core__echo"}], "total": 1})
        if request.url.path == "/v1/tools/core__echo":
            body = {"versions": [manifest("core__echo", EchoIn).model_dump(mode="json")]}
            return httpx.Response(200, json=body)
        problem = {
            "title": "Too Many Requests",
            "detail": "slow down",
            "code": "rate_limit_exceeded",
        }
        return httpx.Response(429, json=problem, headers={"Retry-After": "2"})

    async with HttpFleet.open(
        "http://api",
        token="tok",
        tenant_id="t1",
        agent_did="did:agent:http",
        transport=httpx.MockTransport(refuse),
    ) as fleet:
        runner = await ToolRunner.open(fleet, run_id="refused")
        (envelope,) = await runner.run_turn(0, [parse_call("c1", "core__echo", '{"message": "x"}')])
    assert envelope.status == "error"
    assert envelope.invocation_id is None
    assert envelope.error is not None
    assert envelope.error.code.value == "rate_limit_exceeded"
    assert envelope.error.retryable
    assert envelope.error.retry_after_s == 2
    assert "tok" not in envelope.error.message
