"""The adapters against their golden files (``tests/golden/agent/``).

Recorded streams were built with the official packages' models; each line must still
validate as one of their stream events, and must assemble to the same calls. Tool
definitions and result messages must equal the reviewed files byte for byte (as JSON).
Regenerate with ``python -m tests.support.agent_golden`` after a deliberate change.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from tests.support.agent_golden import ADAPTERS, GOLDEN, expected
from toolfleet.agent.schema import ANTHROPIC_STRICT_KEYWORDS, OPENAI_STRICT_KEYWORDS

pytestmark = pytest.mark.unit

SDK_EVENT: dict[str, TypeAdapter[Any]] = {
    "openai_chat": TypeAdapter(ChatCompletionChunk),
    "openai_responses": TypeAdapter(ResponseStreamEvent),
    "anthropic": TypeAdapter(RawMessageStreamEvent),
}
PROVIDER_IDS = {
    "openai_chat": ["call_w", "call_e"],
    "openai_responses": ["call_w", "call_e"],
    "anthropic": ["toolu_w", "toolu_e"],
}


@pytest.mark.parametrize("name", sorted(expected()))
def test_adapter_output_matches_its_golden_file(name: str) -> None:
    pinned = json.loads((GOLDEN / name).read_text(encoding="utf-8"))
    assert expected()[name] == pinned


@pytest.mark.parametrize("provider", sorted(ADAPTERS))
def test_recorded_stream_assembles_to_the_calls(provider: str) -> None:
    lines = (GOLDEN / f"{provider}.stream.jsonl").read_text(encoding="utf-8").splitlines()
    decoder = ADAPTERS[provider].stream()
    for line in lines:
        event = json.loads(line)
        SDK_EVENT[provider].validate_python(event)  # still a valid event of the SDK
        decoder.feed(event)
    turn = decoder.finish()
    assert [c.provider_call_id for c in turn.calls] == PROVIDER_IDS[provider]
    assert [c.tool for c in turn.calls] == ["acme__weather", "core__echo"]
    assert [c.arguments for c in turn.calls] == [
        {"address": {"city": "Lyon", "zip": None}, "units": "metric"},
        {"message": "bonjour"},
    ]
    assert all(c.decode_error is None for c in turn.calls)


def _keywords(node: Any, path: str = "#") -> list[tuple[str, str]]:
    """Every (pointer, keyword) of a schema node and its sub-schemas."""
    if not isinstance(node, dict):
        return []
    found = [(path, k) for k in node]
    for name, sub in (node.get("properties") or {}).items():
        found += _keywords(sub, f"{path}/properties/{name}")
    found += _keywords(node.get("items"), f"{path}/items")
    found += _keywords(node.get("additionalProperties"), f"{path}/additionalProperties")
    for i, sub in enumerate(node.get("anyOf") or []):
        found += _keywords(sub, f"{path}/anyOf/{i}")
    return found


STRICT_DOCUMENTED = {
    "openai_chat": OPENAI_STRICT_KEYWORDS,
    "openai_responses": OPENAI_STRICT_KEYWORDS,
    "anthropic": ANTHROPIC_STRICT_KEYWORDS,
}


def _strict_schemas(provider: str) -> list[Any]:
    tools = json.loads((GOLDEN / f"{provider}.tools.strict.json").read_text(encoding="utf-8"))
    if provider == "openai_chat":
        return [t["function"]["parameters"] for t in tools]
    if provider == "anthropic":
        return [t["input_schema"] for t in tools]
    return [t["parameters"] for t in tools]


@pytest.mark.parametrize("provider", sorted(STRICT_DOCUMENTED))
def test_strict_schemas_use_only_the_providers_documented_keywords(provider: str) -> None:
    schemas = _strict_schemas(provider)
    assert schemas
    refused = [
        (path, keyword)
        for schema in schemas
        for path, keyword in _keywords(schema)
        if keyword not in STRICT_DOCUMENTED[provider]
    ]
    assert refused == []
