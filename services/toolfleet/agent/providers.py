"""Wire formats: OpenAI Chat Completions, OpenAI Responses, Anthropic Messages.

Each class implements :class:`~toolfleet.agent.adapters.ProviderAdapter` over plain
dicts shaped like the provider's JSON (``model_dump()`` of the official SDK objects,
or an HTTP endpoint's body), so none of the official packages is needed at run time.
Stream decoders keep their partial calls in the decoder object: one per response.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toolfleet.agent.adapters import ProviderAdapter, parse_call, result_text
from toolfleet.agent.catalog import RunCatalog
from toolfleet.agent.records import ModelTurn, ToolCall, ToolEnvelope

__all__ = ["AnthropicMessages", "OpenAIChat", "OpenAIResponses", "adapter_named"]


def _clean(value: Mapping[str, Any]) -> dict[str, Any]:
    """A response item without the ``None`` fields the SDKs' ``model_dump`` adds."""
    return {k: v for k, v in value.items() if v is not None}


def _as_dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _index(value: Any) -> int:
    """A stream event's position; anything but an int counts as the first."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


# --- OpenAI Chat Completions ---------------------------------------------------------


class OpenAIChat:
    """``POST /v1/chat/completions``: ``tools[]``, ``message.tool_calls``, ``tool`` messages."""

    name = "openai-chat"

    def encode_tools(self, catalog: RunCatalog) -> list[dict[str, Any]]:
        tools = []
        for tool in catalog.tools:
            function: dict[str, Any] = {
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.schema,
            }
            if catalog.strict:
                function["strict"] = True
            tools.append({"type": "function", "function": function})
        return tools

    def decode(self, response: Mapping[str, Any]) -> ModelTurn:
        choices = _as_list(response.get("choices")) or [{}]
        message = _as_dict(_as_dict(choices[0]).get("message"))
        raw_calls = [_as_dict(c) for c in _as_list(message.get("tool_calls"))]
        calls = [
            parse_call(
                str(c.get("id", "")),
                str(_as_dict(c.get("function")).get("name", "")),
                str(_as_dict(c.get("function")).get("arguments") or ""),
            )
            for c in raw_calls
        ]
        return _chat_turn(str(message.get("content") or ""), calls)

    def stream(self) -> OpenAIChatStream:
        return OpenAIChatStream()

    def result_messages(self, envelopes: Sequence[ToolEnvelope]) -> list[dict[str, Any]]:
        messages = []
        for envelope in envelopes:
            text, is_error = result_text(envelope)
            content = f"ERROR: {text}" if is_error else text
            messages.append(
                {"role": "tool", "tool_call_id": envelope.provider_call_id, "content": content}
            )
        return messages


def _chat_turn(content: str, calls: list[ToolCall]) -> ModelTurn:
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [
            {
                "id": c.provider_call_id,
                "type": "function",
                "function": {"name": c.tool, "arguments": c.raw_arguments},
            }
            for c in calls
        ]
    return ModelTurn(calls=calls, assistant_messages=[message], text=content)


@dataclass
class _Partial:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIChatStream:
    """Assembles ``choices[0].delta.tool_calls`` fragments, by ``index``, interleaved."""

    def __init__(self) -> None:
        self._calls: dict[int, _Partial] = {}
        self._text: list[str] = []

    def feed(self, event: Mapping[str, Any]) -> None:
        for choice in _as_list(event.get("choices")):
            delta = _as_dict(_as_dict(choice).get("delta"))
            if delta.get("content"):
                self._text.append(str(delta["content"]))
            for fragment in _as_list(delta.get("tool_calls")):
                fragment = _as_dict(fragment)
                partial = self._calls.setdefault(_index(fragment.get("index")), _Partial())
                if fragment.get("id"):
                    partial.call_id = str(fragment["id"])
                function = _as_dict(fragment.get("function"))
                if function.get("name"):
                    partial.name += str(function["name"])
                if function.get("arguments"):
                    partial.arguments.append(str(function["arguments"]))

    def finish(self) -> ModelTurn:
        calls = [
            parse_call(p.call_id, p.name, "".join(p.arguments))
            for _, p in sorted(self._calls.items())
        ]
        return _chat_turn("".join(self._text), calls)


# --- OpenAI Responses ----------------------------------------------------------------


class OpenAIResponses:
    """``POST /v1/responses``: function tools, ``function_call`` items, ``function_call_output``.

    The next turn's history keeps the response's ``reasoning``, ``function_call`` and
    ``message`` items in order (with a reasoning item's ``encrypted_content`` when the
    request asked for it), as reasoning models need them passed back."""

    name = "openai-responses"

    def encode_tools(self, catalog: RunCatalog) -> list[dict[str, Any]]:
        return [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.schema,
                "strict": catalog.strict,
            }
            for tool in catalog.tools
        ]

    def decode(self, response: Mapping[str, Any]) -> ModelTurn:
        items = [_as_dict(i) for i in _as_list(response.get("output"))]
        return _responses_turn(items)

    def stream(self) -> OpenAIResponsesStream:
        return OpenAIResponsesStream()

    def result_messages(self, envelopes: Sequence[ToolEnvelope]) -> list[dict[str, Any]]:
        items = []
        for envelope in envelopes:
            text, is_error = result_text(envelope)
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": envelope.provider_call_id,
                    "output": f"ERROR: {text}" if is_error else text,
                }
            )
        return items


_RESPONSES_HISTORY = frozenset({"reasoning", "function_call", "message"})
"""Output items appended to the history (in the model's order) for the next turn."""


def _responses_turn(items: list[dict[str, Any]]) -> ModelTurn:
    calls, text = [], []
    for item in items:
        if item.get("type") == "function_call":
            calls.append(
                parse_call(
                    str(item.get("call_id", "")),
                    str(item.get("name", "")),
                    str(item.get("arguments") or ""),
                )
            )
        elif item.get("type") == "message":
            for part in _as_list(item.get("content")):
                part = _as_dict(part)
                if part.get("type") == "output_text":
                    text.append(str(part.get("text", "")))
    # Reasoning items go back too: reasoning models need them with the calls they led to.
    history = [_clean(i) for i in items if _text(i.get("type")) in _RESPONSES_HISTORY]
    return ModelTurn(calls=calls, assistant_messages=history, text="".join(text))


class OpenAIResponsesStream:
    """Assembles ``response.function_call_arguments.delta`` events by ``output_index``."""

    def __init__(self) -> None:
        self._items: dict[int, dict[str, Any]] = {}
        self._arguments: dict[int, list[str]] = {}

    def feed(self, event: Mapping[str, Any]) -> None:
        kind = _text(event.get("type"))
        index = _index(event.get("output_index"))
        if kind in {"response.output_item.added", "response.output_item.done"}:
            self._items[index] = {**self._items.get(index, {}), **_as_dict(event.get("item"))}
        elif kind == "response.function_call_arguments.delta":
            self._arguments.setdefault(index, []).append(str(event.get("delta", "")))
        elif kind == "response.function_call_arguments.done":
            self._arguments[index] = [str(event.get("arguments", ""))]

    def finish(self) -> ModelTurn:
        items = []
        for index, item in sorted(self._items.items()):
            if item.get("type") == "function_call" and not item.get("arguments"):
                item = {**item, "arguments": "".join(self._arguments.get(index, []))}
            items.append(item)
        return _responses_turn(items)


# --- Anthropic Messages --------------------------------------------------------------


class AnthropicMessages:
    """``POST /v1/messages``: ``tools[]``, ``tool_use`` blocks, ``tool_result`` blocks."""

    name = "anthropic"

    def encode_tools(self, catalog: RunCatalog) -> list[dict[str, Any]]:
        tools = []
        for tool in catalog.tools:
            definition: dict[str, Any] = {
                "name": tool.name,
                "description": tool.description,
                "input_schema": tool.schema,
            }
            if catalog.strict:
                definition["strict"] = True
            tools.append(definition)
        return tools

    def decode(self, response: Mapping[str, Any]) -> ModelTurn:
        return _anthropic_turn([_as_dict(b) for b in _as_list(response.get("content"))])

    def stream(self) -> AnthropicStream:
        return AnthropicStream()

    def result_messages(self, envelopes: Sequence[ToolEnvelope]) -> list[dict[str, Any]]:
        if not envelopes:
            return []
        blocks = []
        for envelope in envelopes:
            text, is_error = result_text(envelope)
            blocks.append(
                {
                    "type": "tool_result",
                    "tool_use_id": envelope.provider_call_id,
                    "content": text,
                    "is_error": is_error,
                }
            )
        return [{"role": "user", "content": blocks}]


def _anthropic_turn(blocks: list[dict[str, Any]]) -> ModelTurn:
    calls, text, content = [], [], []
    for block in blocks:
        if block.get("type") == "tool_use":
            raw = block.get("input")
            partial = block.get("_partial_json")
            call = parse_call(
                str(block.get("id", "")),
                str(block.get("name", "")),
                partial if isinstance(partial, str) else _as_dict(raw),
            )
            calls.append(call)
            content.append(
                {
                    "type": "tool_use",
                    "id": call.provider_call_id,
                    "name": call.tool,
                    "input": call.arguments if call.arguments is not None else {},
                }
            )
        elif block.get("type") == "text":
            text.append(str(block.get("text", "")))
            content.append({"type": "text", "text": str(block.get("text", ""))})
    message = {"role": "assistant", "content": content}
    return ModelTurn(calls=calls, assistant_messages=[message], text="".join(text))


class AnthropicStream:
    """Assembles ``content_block_start`` + ``input_json_delta`` fragments, by block ``index``."""

    def __init__(self) -> None:
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}

    def feed(self, event: Mapping[str, Any]) -> None:
        kind = _text(event.get("type"))
        index = _index(event.get("index"))
        if kind == "content_block_start":
            self._blocks[index] = _as_dict(event.get("content_block"))
        elif kind == "content_block_delta":
            delta = _as_dict(event.get("delta"))
            if delta.get("type") == "input_json_delta":
                self._json.setdefault(index, []).append(str(delta.get("partial_json", "")))
            elif delta.get("type") == "text_delta":
                block = self._blocks.setdefault(index, {"type": "text", "text": ""})
                block["text"] = str(block.get("text", "")) + str(delta.get("text", ""))

    def finish(self) -> ModelTurn:
        blocks = []
        for index, block in sorted(self._blocks.items()):
            if block.get("type") == "tool_use":
                block = {**block, "_partial_json": "".join(self._json.get(index, []))}
            blocks.append(block)
        return _anthropic_turn(blocks)


def adapter_named(name: str) -> ProviderAdapter:
    """The adapter a replay bundle names."""
    for adapter in _ADAPTERS:
        if adapter.name == name:
            return adapter
    raise ValueError(f"unknown provider adapter {name!r}")


# Typed as the port: mypy checks that each class implements it.
_ADAPTERS: tuple[ProviderAdapter, ...] = (OpenAIChat(), OpenAIResponses(), AnthropicMessages())
