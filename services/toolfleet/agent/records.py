"""What an agent run deals in: decoded tool calls, model turns, envelopes, events (no I/O).

Every record is pydantic so a run can be written to a replay bundle and read back.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.contract.progress import EventKind
from toolfleet.errors import ErrorInfo

__all__ = [
    "AgentEvent",
    "EventKind",
    "ModelTurn",
    "ToolCall",
    "ToolEnvelope",
    "call_id",
    "canonical_json",
]


def canonical_json(value: Any) -> str:
    """Sorted keys, no spaces, UTF-8 kept: the same value always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def call_id(*, run_id: str, turn: int, index: int, tool: str, arguments: Any) -> str:
    """The deterministic id of a call: the same run, turn, position, tool and arguments
    always give the same id, which is the invocation's idempotency key. A re-run of a
    crashed loop therefore finds every call it already made."""
    digest = hashlib.sha256(
        canonical_json([run_id, turn, index, tool, arguments]).encode()
    ).hexdigest()
    return f"tfc_{digest[:40]}"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ToolCall(_Record):
    """One tool call as a provider's response asked for it."""

    provider_call_id: str
    """The provider's id (``call_...``, ``toolu_...``): results must quote it back."""
    tool: str
    """The tool's name as the model wrote it (toolfleet's tool id)."""
    arguments: dict[str, Any] | None
    """The parsed arguments; ``None`` when ``raw_arguments`` is not a JSON object."""
    raw_arguments: str
    """The arguments exactly as the model sent them."""
    decode_error: str | None = None
    """Why ``raw_arguments`` could not be used, in words the model can correct from."""


class ModelTurn(_Record):
    """One model response, decoded: its tool calls and what to append to the history."""

    calls: list[ToolCall] = Field(default_factory=list)
    assistant_messages: list[dict[str, Any]] = Field(default_factory=list)
    """The provider-shaped message(s) the model wrote, to send back on the next turn."""
    text: str = ""
    """The model's text, when it wrote any."""


class ToolEnvelope(_Record):
    """What one call did: the entries of ``tools_by_id``, ``tool_order``, ``last_tool``."""

    call_id: str
    """Deterministic id (run, turn, index, tool, canonical arguments); the idempotency key."""
    provider_call_id: str
    turn: int
    index: int
    tool: str
    version: str | None = None
    input: dict[str, Any] | None = None
    """The arguments sent to the fleet (pinned handles resolved)."""
    status: str
    """An invocation status (``success``, ``error``, ``permission_denied``, ...)."""
    output: dict[str, Any] | None = None
    error: ErrorInfo | None = None
    started_at: datetime
    ended_at: datetime
    cached: bool = False
    """The tool answered from its result cache (the fleet's ``execution_metadata``)."""
    deduplicated: bool = False
    """Answered from an earlier run's call with the same id (a re-run after a crash):
    the tool did not run again; times and ``runtime_ms`` are the first execution's."""
    truncated: bool = False
    attachments: list[str] = Field(default_factory=list)
    """URLs of attachments (the whole result of a truncated one)."""
    invocation_id: str | None = None
    """``None`` when the call never reached the fleet (refused by the runner)."""
    trace_id: str | None = None
    runtime_ms: int = 0
    result_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "success"


class AgentEvent(_Record):
    """One entry of a run's event stream."""

    kind: EventKind
    call_id: str
    tool: str
    turn: int
    invocation_id: str | None = None
    progress_percent: float | None = None
    current_phase: str = ""
    envelope: ToolEnvelope | None = None
    """On ``tool_call_result``: the finished call."""
