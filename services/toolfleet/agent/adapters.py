"""The port every provider's wire format implements, and what they share.

An adapter turns the run's catalog into the provider's tool definitions, a provider
response (whole, or streamed through a :class:`StreamDecoder`) into a
:class:`~toolfleet.agent.records.ModelTurn`, and envelopes back into the provider's
result messages. Adapters deal in plain dicts shaped like the provider's JSON: the
official ``openai``/``anthropic`` packages are not needed at run time (pass
``response.model_dump()`` of their objects, or the JSON an HTTP endpoint returned).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from toolfleet.agent.catalog import RunCatalog
from toolfleet.agent.records import ModelTurn, ToolCall, ToolEnvelope, canonical_json

__all__ = [
    "ProviderAdapter",
    "StreamDecoder",
    "parse_call",
    "result_text",
]


class StreamDecoder(Protocol):
    """Assembles one streamed response; its state lives for that response only."""

    def feed(self, event: Mapping[str, Any]) -> None:
        """Take one stream event (chunk) as the provider sent it."""
        ...

    def finish(self) -> ModelTurn:
        """The whole turn, once the stream has ended."""
        ...


class ProviderAdapter(Protocol):
    """One provider's wire format."""

    name: str

    def encode_tools(self, catalog: RunCatalog) -> list[dict[str, Any]]:
        """The catalog as the provider's tool definitions."""
        ...

    def decode(self, response: Mapping[str, Any]) -> ModelTurn:
        """A whole (non-streamed) response."""
        ...

    def stream(self) -> StreamDecoder:
        """A fresh decoder for one streamed response."""
        ...

    def result_messages(self, envelopes: Sequence[ToolEnvelope]) -> list[dict[str, Any]]:
        """The results of one turn, to append to the conversation."""
        ...


def parse_call(provider_call_id: str, tool: str, raw: str | Mapping[str, Any]) -> ToolCall:
    """A call record; arguments that are not a JSON object keep ``decode_error`` set.

    Never raises: a malformed call becomes an error result the model can correct.
    """
    if isinstance(raw, Mapping):
        return ToolCall(
            provider_call_id=provider_call_id,
            tool=tool,
            arguments=dict(raw),
            raw_arguments=canonical_json(raw),
        )
    text = raw.strip()
    if not text:
        return ToolCall(
            provider_call_id=provider_call_id, tool=tool, arguments={}, raw_arguments=raw
        )
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        # Some messages end in "at" ("Unterminated string starting at"): say it once.
        reason = exc.msg.removesuffix(" at")
        error = f"the arguments are not valid JSON ({reason} at character {exc.pos})"
        return _bad(provider_call_id, tool, raw, error)
    if not isinstance(value, dict):
        return _bad(provider_call_id, tool, raw, "the arguments must be a JSON object")
    return ToolCall(
        provider_call_id=provider_call_id, tool=tool, arguments=value, raw_arguments=raw
    )


def _bad(provider_call_id: str, tool: str, raw: str, error: str) -> ToolCall:
    return ToolCall(
        provider_call_id=provider_call_id,
        tool=tool,
        arguments=None,
        raw_arguments=raw,
        decode_error=error,
    )


def result_text(envelope: ToolEnvelope) -> tuple[str, bool]:
    """What the model reads about a finished call, and whether it is an error.

    A truncated result is its preview plus the URL of the whole result; an error names
    its code and message (and the failing fields of invalid arguments) so the model can
    correct the call on its next turn.
    """
    if envelope.ok:
        if envelope.truncated:
            body: dict[str, Any] = {
                "truncated": True,
                "preview": envelope.output,
                "attachments": envelope.attachments,
            }
            return canonical_json(body), False
        return canonical_json(envelope.output or {}), False
    if envelope.status == "pending_approval":
        return "the call is waiting for a human approval", True
    error = envelope.error
    if error is None:
        return f"error ({envelope.status})", True
    text = f"error ({error.code.value}): {error.message}"
    fields = error.details.get("errors")
    if isinstance(fields, list) and fields:
        problems = "; ".join(
            f"{f.get('field', '/')}: {f.get('message', '')}" for f in fields if isinstance(f, dict)
        )
        text += f" [{problems}]"
    if error.code.value == "invalid_parameters":
        text += ". Call the tool again with corrected arguments."
    elif error.retryable:
        text += " (retryable)"
    else:
        limit = error.details.get("limit")
        if error.code.value == "resource_exhausted" and isinstance(limit, str):
            text += f" (the run's {limit} limit: not retryable in this run)"
    return text, True
