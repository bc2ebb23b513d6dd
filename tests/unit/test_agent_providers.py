"""Golden fixtures per provider, built with the official ``openai``/``anthropic`` types.

The adapters themselves never import those packages: the tests build requests,
responses and recorded streams with the SDKs' own models (no network), feed their
``model_dump()`` to the adapters, and check what comes out against the SDKs' request
types, key by key.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from anthropic.types import (
    Message,
    MessageParam,
    RawContentBlockDeltaEvent,
    RawContentBlockStartEvent,
    ToolParam,
    ToolResultBlockParam,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionAssistantMessageParam,
    ChatCompletionChunk,
    ChatCompletionFunctionToolParam,
    ChatCompletionToolMessageParam,
)
from openai.types.responses import (
    FunctionToolParam,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseInputItemParam,
    ResponseOutputItemAddedEvent,
    ResponseReasoningItem,
)
from openai.types.responses.response_input_param import FunctionCallOutput
from pydantic import TypeAdapter

from tests.support.agent_fixtures import catalog
from toolfleet.agent.adapters import parse_call
from toolfleet.agent.providers import AnthropicMessages, OpenAIChat, OpenAIResponses
from toolfleet.agent.records import ToolEnvelope
from toolfleet.errors import ErrorCode, ErrorInfo

pytestmark = pytest.mark.unit

ARGS_A = '{"address": {"city": "Lyon"}, "days": 2}'
ARGS_B = '{"message": "hi"}'
NOW = datetime(2026, 11, 24, tzinfo=UTC)


def _envelope(provider_id: str, **kw: Any) -> ToolEnvelope:
    base: dict[str, Any] = {
        "call_id": "tfc_x",
        "provider_call_id": provider_id,
        "turn": 0,
        "index": 0,
        "tool": "core__echo",
        "status": "success",
        "output": {"value": "hi"},
        "started_at": NOW,
        "ended_at": NOW,
    }
    return ToolEnvelope(**{**base, **kw})


OK = _envelope("call_1")
TRUNCATED = _envelope(
    "call_2",
    truncated=True,
    output={"value": "hel…"},
    attachments=["/v1/invocations/i/attachments/b"],
)
FAILED = _envelope(
    "call_3",
    status="error",
    output=None,
    error=ErrorInfo(
        code=ErrorCode.INVALID_PARAMETERS,
        message="the arguments are not valid JSON (Expecting ',' delimiter at character 9)",
    ),
)


# --- OpenAI Chat Completions ---------------------------------------------------------


def test_chat_tools_have_exactly_the_documented_keys() -> None:
    tools = OpenAIChat().encode_tools(catalog())
    assert [t["function"]["name"] for t in tools] == ["acme__weather", "core__echo"]
    for tool in tools:
        assert set(tool) == {"type", "function"}
        assert set(tool["function"]) == {"name", "description", "parameters"}
        TypeAdapter(ChatCompletionFunctionToolParam).validate_python(tool)
    weather = tools[0]["function"]["parameters"]
    assert "$defs" not in json.dumps(weather)
    assert weather["properties"]["units"]["type"] == ["string", "null"]
    assert weather["properties"]["address"]["properties"]["city"] == {
        "title": "City",
        "type": "string",
    }


def test_chat_tools_in_strict_mode_close_every_object() -> None:
    tools = OpenAIChat().encode_tools(catalog(strict=True))
    function = tools[0]["function"]
    assert function["strict"] is True
    params = function["parameters"]
    assert params["additionalProperties"] is False
    assert params["required"] == ["address", "units", "days"]
    assert params["properties"]["days"]["type"] == ["integer", "null"]
    assert params["properties"]["address"]["additionalProperties"] is False


def test_chat_response_decodes_to_call_records() -> None:
    response = ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-test",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_a",
                                "type": "function",
                                "function": {"name": "acme__weather", "arguments": ARGS_A},
                            },
                            {
                                "id": "call_b",
                                "type": "function",
                                "function": {"name": "core__echo", "arguments": '{"message": '},
                            },
                        ],
                    },
                }
            ],
        }
    )
    turn = OpenAIChat().decode(response.model_dump())
    first, second = turn.calls
    assert (first.provider_call_id, first.tool, first.raw_arguments) == (
        "call_a",
        "acme__weather",
        ARGS_A,
    )
    assert first.arguments == {"address": {"city": "Lyon"}, "days": 2}
    assert second.arguments is None
    assert second.decode_error is not None
    assert "not valid JSON" in second.decode_error
    (assistant,) = turn.assistant_messages
    assert set(assistant) == {"role", "content", "tool_calls"}
    TypeAdapter(ChatCompletionAssistantMessageParam).validate_python(assistant)
    assert assistant["tool_calls"][1]["function"]["arguments"] == '{"message": '


def _chunk(delta: dict[str, Any]) -> dict[str, Any]:
    return ChatCompletionChunk.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "gpt-test",
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
    ).model_dump()


def test_chat_stream_assembles_interleaved_calls_by_index() -> None:
    def start(index: int, cid: str, name: str) -> dict[str, Any]:
        return {
            "tool_calls": [
                {
                    "index": index,
                    "id": cid,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
            ]
        }

    def part(index: int, text: str) -> dict[str, Any]:
        return {"tool_calls": [{"index": index, "function": {"arguments": text}}]}

    chunks = [
        _chunk({"role": "assistant", "content": "Let me check."}),
        _chunk(start(0, "call_a", "acme__weather")),
        _chunk(start(1, "call_b", "core__echo")),
        _chunk(part(1, ARGS_B[:5])),
        _chunk(part(0, ARGS_A[:12])),
        _chunk(part(1, ARGS_B[5:])),
        _chunk(part(0, ARGS_A[12:])),
    ]
    decoder = OpenAIChat().stream()
    for chunk in chunks:
        decoder.feed(chunk)
    turn = decoder.finish()
    assert [(c.provider_call_id, c.tool, c.raw_arguments) for c in turn.calls] == [
        ("call_a", "acme__weather", ARGS_A),
        ("call_b", "core__echo", ARGS_B),
    ]
    assert turn.text == "Let me check."
    # Each stream decoder has its own state: a second response starts empty.
    assert OpenAIChat().stream().finish().calls == []


def test_chat_results_are_tool_messages() -> None:
    messages = OpenAIChat().result_messages([OK, TRUNCATED, FAILED])
    for message in messages:
        assert set(message) == {"role", "tool_call_id", "content"}
        TypeAdapter(ChatCompletionToolMessageParam).validate_python(message)
    ok, truncated, failed = messages
    assert (ok["tool_call_id"], json.loads(ok["content"])) == ("call_1", {"value": "hi"})
    assert json.loads(truncated["content"]) == {
        "truncated": True,
        "preview": {"value": "hel…"},
        "attachments": ["/v1/invocations/i/attachments/b"],
    }
    assert failed["content"].startswith("ERROR: error (invalid_parameters): the arguments")
    assert failed["content"].endswith("Call the tool again with corrected arguments.")


# --- OpenAI Responses ----------------------------------------------------------------


def test_responses_function_tools_have_exactly_the_documented_keys() -> None:
    tools = OpenAIResponses().encode_tools(catalog())
    for tool in tools:
        assert set(tool) == {"type", "name", "description", "parameters", "strict"}
        TypeAdapter(FunctionToolParam).validate_python(tool)
    assert tools[1]["parameters"]["required"] == ["message"]


def _function_call(item_id: str, call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return ResponseFunctionToolCall.model_validate(
        {
            "type": "function_call",
            "id": item_id,
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": "completed",
        }
    ).model_dump()


def test_responses_output_decodes_and_results_are_function_call_outputs() -> None:
    output = [
        _function_call("fc_1", "call_a", "acme__weather", ARGS_A),
        _function_call("fc_2", "call_b", "core__echo", ARGS_B),
    ]
    turn = OpenAIResponses().decode({"output": output})
    assert [(c.provider_call_id, c.tool, c.arguments) for c in turn.calls] == [
        ("call_a", "acme__weather", {"address": {"city": "Lyon"}, "days": 2}),
        ("call_b", "core__echo", {"message": "hi"}),
    ]
    assert all(None not in item.values() for item in turn.assistant_messages)
    outputs = OpenAIResponses().result_messages([OK, FAILED])
    for item in outputs:
        assert set(item) == {"type", "call_id", "output"}
        TypeAdapter(FunctionCallOutput).validate_python(item)
    assert outputs[1]["output"].startswith("ERROR: ")


def test_responses_keeps_reasoning_items_in_the_history() -> None:
    # Reasoning models need their reasoning items passed back with the calls they led to.
    reasoning = ResponseReasoningItem(
        id="rs_1",
        type="reasoning",
        summary=[{"type": "summary_text", "text": "look up the weather first"}],
        encrypted_content="gAAAA-opaque",
    ).model_dump()
    output = [reasoning, _function_call("fc_1", "call_a", "acme__weather", ARGS_A)]
    turn = OpenAIResponses().decode({"output": output})
    assert [item["type"] for item in turn.assistant_messages] == ["reasoning", "function_call"]
    kept = turn.assistant_messages[0]
    assert kept["id"] == "rs_1"
    assert kept["encrypted_content"] == "gAAAA-opaque"
    for item in turn.assistant_messages:
        TypeAdapter(ResponseInputItemParam).validate_python(item)

    decoder = OpenAIResponses().stream()
    decoder.feed({"type": "response.output_item.done", "output_index": 0, "item": reasoning})
    decoder.feed({"type": "response.output_item.done", "output_index": 1, "item": output[1]})
    assert [i["type"] for i in decoder.finish().assistant_messages] == [
        "reasoning",
        "function_call",
    ]


def test_responses_stream_assembles_arguments_by_output_index() -> None:
    def added(index: int, item_id: str, call_id: str, name: str) -> dict[str, Any]:
        return ResponseOutputItemAddedEvent.model_validate(
            {
                "type": "response.output_item.added",
                "output_index": index,
                "sequence_number": index,
                "item": _function_call(item_id, call_id, name, ""),
            }
        ).model_dump()

    def delta(index: int, item_id: str, text: str) -> dict[str, Any]:
        return ResponseFunctionCallArgumentsDeltaEvent.model_validate(
            {
                "type": "response.function_call_arguments.delta",
                "output_index": index,
                "item_id": item_id,
                "delta": text,
                "sequence_number": 10,
            }
        ).model_dump()

    events = [
        added(0, "fc_1", "call_a", "acme__weather"),
        added(1, "fc_2", "call_b", "core__echo"),
        delta(1, "fc_2", ARGS_B[:4]),
        delta(0, "fc_1", ARGS_A[:20]),
        delta(1, "fc_2", ARGS_B[4:]),
        delta(0, "fc_1", ARGS_A[20:]),
    ]
    decoder = OpenAIResponses().stream()
    for event in events:
        decoder.feed(event)
    turn = decoder.finish()
    assert [(c.provider_call_id, c.raw_arguments) for c in turn.calls] == [
        ("call_a", ARGS_A),
        ("call_b", ARGS_B),
    ]


# --- Anthropic Messages --------------------------------------------------------------


def test_anthropic_tools_have_exactly_the_documented_keys() -> None:
    tools = AnthropicMessages().encode_tools(catalog())
    for tool in tools:
        assert set(tool) == {"name", "description", "input_schema"}
        TypeAdapter(ToolParam).validate_python(tool)
    assert tools[0]["input_schema"]["type"] == "object"
    assert set(AnthropicMessages().encode_tools(catalog(strict=True))[0]) == {
        "name",
        "description",
        "input_schema",
        "strict",
    }


def test_anthropic_message_decodes_tool_use_blocks() -> None:
    message = Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_a",
                    "name": "acme__weather",
                    "input": {"address": {"city": "Lyon"}},
                },
                {"type": "tool_use", "id": "toolu_b", "name": "core__echo", "input": {}},
            ],
        }
    )
    turn = AnthropicMessages().decode(message.model_dump())
    assert [(c.provider_call_id, c.tool, c.arguments) for c in turn.calls] == [
        ("toolu_a", "acme__weather", {"address": {"city": "Lyon"}}),
        ("toolu_b", "core__echo", {}),
    ]
    assert turn.text == "Checking."
    (assistant,) = turn.assistant_messages
    TypeAdapter(MessageParam).validate_python(assistant)
    assert [set(b) for b in assistant["content"]] == [
        {"type", "text"},
        {"type", "id", "name", "input"},
        {"type", "id", "name", "input"},
    ]


def test_anthropic_stream_assembles_input_json_deltas() -> None:
    def start(index: int, block: dict[str, Any]) -> dict[str, Any]:
        return RawContentBlockStartEvent.model_validate(
            {"type": "content_block_start", "index": index, "content_block": block}
        ).model_dump()

    def delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
        return RawContentBlockDeltaEvent.model_validate(
            {"type": "content_block_delta", "index": index, "delta": delta}
        ).model_dump()

    def json_part(index: int, text: str) -> dict[str, Any]:
        return delta(index, {"type": "input_json_delta", "partial_json": text})

    tool_a = {"type": "tool_use", "id": "toolu_a", "name": "acme__weather", "input": {}}
    tool_b = {"type": "tool_use", "id": "toolu_b", "name": "core__echo", "input": {}}
    events = [
        {"type": "message_start"},
        start(0, {"type": "text", "text": ""}),
        delta(0, {"type": "text_delta", "text": "On it."}),
        {"type": "content_block_stop", "index": 0},
        start(1, tool_a),
        json_part(1, ARGS_A[:9]),
        json_part(1, ARGS_A[9:]),
        {"type": "content_block_stop", "index": 1},
        start(2, tool_b),
        json_part(2, '{"message": "h'),
        {"type": "content_block_stop", "index": 2},
        {"type": "message_stop"},
    ]
    decoder = AnthropicMessages().stream()
    for event in events:
        decoder.feed(event)
    turn = decoder.finish()
    weather, echo = turn.calls
    assert weather.arguments == {"address": {"city": "Lyon"}, "days": 2}
    assert echo.arguments is None  # the stream was cut inside the JSON
    assert echo.decode_error is not None
    assert turn.text == "On it."


def test_anthropic_results_are_tool_result_blocks_in_one_user_message() -> None:
    (message,) = AnthropicMessages().result_messages([OK, TRUNCATED, FAILED])
    TypeAdapter(MessageParam).validate_python(message)
    assert message["role"] == "user"
    blocks = message["content"]
    for block in blocks:
        assert set(block) == {"type", "tool_use_id", "content", "is_error"}
        TypeAdapter(ToolResultBlockParam).validate_python(block)
    assert [b["is_error"] for b in blocks] == [False, False, True]
    assert json.loads(blocks[1]["content"])["attachments"] == ["/v1/invocations/i/attachments/b"]
    assert blocks[2]["content"].startswith("error (invalid_parameters)")


# --- hostile input -------------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_KEYS = st.sampled_from(
    [
        "type",
        "index",
        "output_index",
        "choices",
        "delta",
        "tool_calls",
        "function",
        "id",
        "name",
        "arguments",
        "content_block",
        "partial_json",
        "item",
        "output",
        "content",
        "message",
        "text",
        "input",
        "call_id",
    ]
)
_EVENT = st.dictionaries(_KEYS, _JSON | st.dictionaries(_KEYS, _JSON, max_size=5), max_size=6)


@settings(max_examples=150, deadline=None)
@given(
    events=st.lists(_EVENT, max_size=6),
    adapter=st.sampled_from([OpenAIChat(), OpenAIResponses(), AnthropicMessages()]),
)
def test_decoders_never_crash_on_whatever_a_provider_sends(
    events: list[dict[str, Any]], adapter: OpenAIChat | OpenAIResponses | AnthropicMessages
) -> None:
    decoder = adapter.stream()
    for event in events:
        decoder.feed(event)
    for turn in (decoder.finish(), *(adapter.decode(e) for e in events)):
        for call in turn.calls:
            assert (call.arguments is None) == (call.decode_error is not None)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ('{"city": "Lyo', "Unterminated string starting at character 9"),
        ('{"city": "Ly\tn"}', "Invalid control character at character 12"),
        ('{"city" "Lyon"}', "Expecting ':' delimiter at character 8"),
    ],
)
def test_invalid_json_feedback_says_where_once(raw: str, reason: str) -> None:
    call = parse_call("call_x", "acme__weather", raw)
    assert call.decode_error == f"the arguments are not valid JSON ({reason})"
    assert " at at " not in call.decode_error
