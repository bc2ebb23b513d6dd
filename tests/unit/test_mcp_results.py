"""MCP results and the call follower: pure mapping, and the wait loop on in-memory twins."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

import jsonschema
import pytest

from toolfleet.api.mcp.calls import FollowInput, MemoryCallIndex, call_key, follow
from toolfleet.api.mcp.results import (
    HANDLE_SCHEMA,
    finished_result,
    handle_result,
    output_schema,
)
from toolfleet.contract.http import InvocationView
from toolfleet.events.models import InvocationStatus
from toolfleet.storage.notices import MemoryFinishedNotices

pytestmark = pytest.mark.unit

NESTED: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {"item": {"$ref": "#/$defs/Item"}},
    "required": ["item"],
    "$defs": {"Item": {"type": "object", "properties": {"n": {"type": "integer"}}}},
}


def view(status: InvocationStatus, **fields: Any) -> InvocationView:
    now = datetime.now(UTC)
    return InvocationView(
        invocation_id=uuid.uuid4(),
        tenant_id="t1",
        tool_id="core__echo",
        status=status,
        created_at=now,
        updated_at=now,
        **fields,
    )


def test_output_schema_accepts_the_tools_result_or_a_handle_and_keeps_refs_resolvable() -> None:
    schema = output_schema(NESTED)
    assert schema["type"] == "object"
    validator = jsonschema.Draft202012Validator(schema)
    validator.validate({"item": {"n": 1}})
    validator.validate({"invocation_id": "x", "status": "pending_approval", "poll": "/v1/x"})
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"item": {"n": "not a number"}})
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({"status": "running"})


def test_a_success_is_structured_content_and_the_same_json_as_text() -> None:
    result = finished_result(view(InvocationStatus.SUCCESS, result={"message": "hi", "length": 2}))
    assert not result.is_error
    assert result.structured_content == {"message": "hi", "length": 2}
    assert result.content[0].text == '{"message":"hi","length":2}'  # type: ignore[union-attr]


def test_a_failure_is_is_error_with_the_typed_code_and_the_field_reasons() -> None:
    error = {
        "code": "invalid_parameters",
        "message": "parameters do not match",
        "details": {"errors": [{"field": "/", "message": "'message' is required"}]},
        "retryable": False,
    }
    result = finished_result(view(InvocationStatus.ERROR, error=error))
    assert result.is_error
    assert result.structured_content == {"error": error}
    assert result.content[0].text == (  # type: ignore[union-attr]
        "invalid_parameters: parameters do not match (/: 'message' is required)"
    )


@pytest.mark.parametrize(
    ("status", "code"),
    [
        (InvocationStatus.CANCELLED, "cancelled"),
        (InvocationStatus.TIMEOUT, "timeout"),
        (InvocationStatus.PERMISSION_DENIED, "permission_denied"),
    ],
)
def test_an_outcome_without_an_error_still_names_a_code(
    status: InvocationStatus, code: str
) -> None:
    result = finished_result(view(status))
    assert result.is_error
    assert result.structured_content["error"]["code"] == code  # type: ignore[index]


def test_a_handle_matches_its_schema_and_names_the_poll_path() -> None:
    result = handle_result(
        "abc", InvocationStatus.PENDING_APPROVAL, status_url="http://api/v1/invocations/abc"
    )
    jsonschema.validate(result.structured_content, HANDLE_SCHEMA)
    assert result.structured_content == {
        "invocation_id": "abc",
        "status": "pending_approval",
        "poll": "/v1/invocations/abc",
    }
    assert "http://api/v1/invocations/abc" in result.content[0].text  # type: ignore[union-attr]


class Script:
    """Views a fake status projection shows, one per read; the last one repeats."""

    def __init__(self, *views: InvocationView | None) -> None:
        self.views = list(views)
        self.read_once = asyncio.Event()

    async def read(self) -> InvocationView | None:
        self.read_once.set()
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]


async def test_follow_reports_each_new_checkpoint_once_and_returns_the_outcome() -> None:
    running = view(InvocationStatus.RUNNING)
    phase = running.model_copy(update={"current_phase": "authorized"})
    step1 = running.model_copy(
        update={
            "progress_percent": 50.0,
            "current_phase": "step 1/2",
            "latest_checkpoint": {"checkpoint_id": "c1"},
        }
    )
    done = running.model_copy(update={"status": InvocationStatus.SUCCESS, "result": {}})
    script = Script(None, running, phase, step1, step1, done)
    reported: list[float] = []

    async def on_progress(v: InvocationView) -> None:
        reported.append(v.progress_percent)

    call = FollowInput(invocation_id="i", wait_s=5, first_poll_s=0.001, max_poll_s=0.002)
    found = await follow(call, script.read, MemoryFinishedNotices(), on_progress)
    assert found is done
    assert reported == [50.0]


async def test_follow_stops_at_pending_approval_and_gives_up_after_the_wait() -> None:
    pending = view(InvocationStatus.PENDING_APPROVAL)
    call = FollowInput(invocation_id="i", wait_s=5, first_poll_s=0.001)
    assert await follow(call, Script(pending).read, MemoryFinishedNotices(), _ignore) is pending

    running = view(InvocationStatus.RUNNING)
    short = FollowInput(invocation_id="i", wait_s=0.05, first_poll_s=0.01)
    assert await follow(short, Script(running).read, MemoryFinishedNotices(), _ignore) is running
    never = FollowInput(invocation_id="i", wait_s=0.05, first_poll_s=0.01)
    assert await follow(never, Script(None).read, MemoryFinishedNotices(), _ignore) is None


async def test_a_finished_notice_wakes_follow_before_its_next_poll() -> None:
    running = view(InvocationStatus.RUNNING)
    done = running.model_copy(update={"status": InvocationStatus.SUCCESS, "result": {}})
    notices = MemoryFinishedNotices()
    script = Script(running)
    call = FollowInput(invocation_id="i", wait_s=30, first_poll_s=30, max_poll_s=30)
    task = asyncio.create_task(follow(call, script.read, notices, _ignore))
    await script.read_once.wait()
    script.views = [done]
    await notices.publish("i")
    assert await asyncio.wait_for(task, 5) is done


async def test_the_call_index_keys_a_request_by_token_and_id_type() -> None:
    index = MemoryCallIndex()
    invocation = uuid.uuid4()
    await index.remember(call_key("jti-1", 7), invocation, ttl_s=60)
    assert await index.recall(call_key("jti-1", 7)) == invocation
    assert await index.recall(call_key("jti-1", "7")) is None
    assert await index.recall(call_key("jti-2", 7)) is None


async def _ignore(_: InvocationView) -> None:
    return None
