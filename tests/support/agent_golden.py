"""Writes the agent runner's golden files: ``python -m tests.support.agent_golden``.

Recorded streams are built event by event with the official ``openai`` and
``anthropic`` packages' own models (no network) and dumped as JSON Lines; the
expected tool definitions and result messages are what the adapters produce for the
fixture catalog, reviewed once and pinned. ``tests/unit/test_agent_golden.py`` fails
when an adapter's output drifts from them; rerun this module after a deliberate change
and review the diff.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.support.agent_fixtures import catalog
from toolfleet.agent.providers import AnthropicMessages, OpenAIChat, OpenAIResponses
from toolfleet.agent.records import ToolEnvelope
from toolfleet.errors import ErrorCode, ErrorInfo

GOLDEN = Path(__file__).resolve().parent.parent / "golden" / "agent"
ADAPTERS = {
    "openai_chat": OpenAIChat(),
    "openai_responses": OpenAIResponses(),
    "anthropic": AnthropicMessages(),
}
WEATHER = '{"address": {"city": "Lyon", "zip": null}, "units": "metric"}'
ECHO = '{"message": "bonjour"}'


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return ChatCompletionChunk.model_validate(
        {
            "id": "chatcmpl-golden",
            "object": "chat.completion.chunk",
            "created": 1764000000,
            "model": "gpt-golden",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    ).model_dump(mode="json")


def _tool_delta(index: int, **fields: Any) -> dict[str, Any]:
    return {"tool_calls": [{"index": index, **fields}]}


def openai_chat_stream() -> list[dict[str, Any]]:
    """Two calls whose argument fragments arrive interleaved, as parallel calls do."""
    start_a = {"id": "call_w", "type": "function"}
    start_b = {"id": "call_e", "type": "function"}
    return [
        _chunk({"role": "assistant", "content": ""}),
        _chunk(_tool_delta(0, **start_a, function={"name": "acme__weather", "arguments": ""})),
        _chunk(_tool_delta(1, **start_b, function={"name": "core__echo", "arguments": ""})),
        _chunk(_tool_delta(0, function={"arguments": WEATHER[:11]})),
        _chunk(_tool_delta(1, function={"arguments": ECHO[:9]})),
        _chunk(_tool_delta(0, function={"arguments": WEATHER[11:40]})),
        _chunk(_tool_delta(1, function={"arguments": ECHO[9:]})),
        _chunk(_tool_delta(0, function={"arguments": WEATHER[40:]})),
        _chunk({}, finish="tool_calls"),
    ]


def openai_responses_stream() -> list[dict[str, Any]]:
    adapter = TypeAdapter[Any](ResponseStreamEvent)
    sequence = iter(range(100))

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        payload = {"type": kind, "sequence_number": next(sequence), **fields}
        return adapter.validate_python(payload).model_dump(mode="json")  # type: ignore[no-any-return]

    def item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
        return {
            "type": "function_call",
            "id": item_id,
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": status,
        }

    w = item("fc_w", "call_w", "acme__weather", "", "in_progress")
    e = item("fc_e", "call_e", "core__echo", "", "in_progress")
    return [
        event("response.output_item.added", output_index=0, item=w),
        event("response.output_item.added", output_index=1, item=e),
        event(
            "response.function_call_arguments.delta",
            output_index=0,
            item_id="fc_w",
            delta=WEATHER[:20],
        ),
        event("response.function_call_arguments.delta", output_index=1, item_id="fc_e", delta=ECHO),
        event(
            "response.function_call_arguments.delta",
            output_index=0,
            item_id="fc_w",
            delta=WEATHER[20:],
        ),
        event(
            "response.function_call_arguments.done",
            output_index=1,
            item_id="fc_e",
            arguments=ECHO,
            name="core__echo",
        ),
        event(
            "response.output_item.done",
            output_index=1,
            item=item("fc_e", "call_e", "core__echo", ECHO, "completed"),
        ),
    ]


def anthropic_stream() -> list[dict[str, Any]]:
    adapter = TypeAdapter[Any](RawMessageStreamEvent)

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        return adapter.validate_python({"type": kind, **fields}).model_dump(mode="json")  # type: ignore[no-any-return]

    def json_part(index: int, text: str) -> dict[str, Any]:
        return event(
            "content_block_delta",
            index=index,
            delta={"type": "input_json_delta", "partial_json": text},
        )

    message = Message.model_validate(
        {
            "id": "msg_golden",
            "type": "message",
            "role": "assistant",
            "model": "claude-golden",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 1},
        }
    ).model_dump(mode="json")
    tool = {"type": "tool_use", "input": {}}
    return [
        event("message_start", message=message),
        event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        event("content_block_delta", index=0, delta={"type": "text_delta", "text": "Checking."}),
        event("content_block_stop", index=0),
        event(
            "content_block_start",
            index=1,
            content_block={**tool, "id": "toolu_w", "name": "acme__weather"},
        ),
        json_part(1, ""),
        json_part(1, WEATHER[:17]),
        json_part(1, WEATHER[17:]),
        event("content_block_stop", index=1),
        event(
            "content_block_start",
            index=2,
            content_block={**tool, "id": "toolu_e", "name": "core__echo"},
        ),
        json_part(2, ECHO),
        event("content_block_stop", index=2),
        event(
            "message_delta",
            delta={"stop_reason": "tool_use", "stop_sequence": None},
            usage={"output_tokens": 40},
        ),
        event("message_stop"),
    ]


STREAMS = {
    "openai_chat": openai_chat_stream,
    "openai_responses": openai_responses_stream,
    "anthropic": anthropic_stream,
}


def result_envelopes() -> list[ToolEnvelope]:
    """A success, a truncated success and a correctable error."""
    base: dict[str, Any] = {
        "call_id": "tfc_golden",
        "turn": 0,
        "index": 0,
        "tool": "core__echo",
        "started_at": "2026-11-24T00:00:00Z",
        "ended_at": "2026-11-24T00:00:01Z",
    }
    return [
        ToolEnvelope(**base, provider_call_id="call_1", status="success", output={"value": "hi"}),
        ToolEnvelope(
            **base,
            provider_call_id="call_2",
            status="success",
            output={"value": "lo…"},
            truncated=True,
            attachments=["/v1/invocations/5f0c/attachments/9a1b"],
        ),
        ToolEnvelope(
            **base,
            provider_call_id="call_3",
            status="error",
            error=ErrorInfo(
                code=ErrorCode.INVALID_PARAMETERS,
                message="the arguments do not match the input schema of core__echo",
                details={"errors": [{"field": "/", "message": "'message' is a required property"}]},
            ),
        ),
    ]


def expected() -> dict[str, Any]:
    """What the adapters produce: the files' contents, by name."""
    files: dict[str, Any] = {}
    for name, adapter in ADAPTERS.items():
        files[f"{name}.tools.json"] = adapter.encode_tools(catalog())
        files[f"{name}.tools.strict.json"] = adapter.encode_tools(catalog(strict=True))
        files[f"{name}.results.json"] = adapter.result_messages(result_envelopes())
    return files


def write() -> None:
    GOLDEN.mkdir(parents=True, exist_ok=True)
    for name, build in STREAMS.items():
        lines = "".join(json.dumps(e, sort_keys=True) + "\n" for e in build())
        (GOLDEN / f"{name}.stream.jsonl").write_text(lines, encoding="utf-8")
    for name, content in expected().items():
        text = json.dumps(content, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        (GOLDEN / name).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    write()
