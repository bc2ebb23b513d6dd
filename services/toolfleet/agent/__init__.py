"""``toolfleet.agent``: the agent side. A tool runner that speaks OpenAI and Anthropic.

The runner shows a model the tools its run may use, decodes the model's tool calls
(whole responses and streams), runs them through the fleet in parallel with
deterministic ids that double as idempotency keys, and feeds the results back in the
provider's shape. ``run_agent`` drives the loop; a bundle records it for ``replay``.

The fleet a run uses is a :class:`FleetPort`: :class:`HttpFleet` (the HTTP API),
:class:`KafkaFleet` (the broker), :class:`ClientFleet` over any open
:class:`~toolfleet.client.Client`, or :class:`MemoryFleet` in tests.
"""

from toolfleet.agent.adapters import ProviderAdapter, StreamDecoder
from toolfleet.agent.catalog import CatalogTool, RunCatalog
from toolfleet.agent.fleets import ClientFleet, HttpFleet, KafkaFleet
from toolfleet.agent.loop import AgentRun, ModelRequest, run_agent
from toolfleet.agent.port import FleetPort, MemoryFleet, Submission, Submitted
from toolfleet.agent.providers import AnthropicMessages, OpenAIChat, OpenAIResponses
from toolfleet.agent.records import AgentEvent, EventKind, ModelTurn, ToolCall, ToolEnvelope
from toolfleet.agent.replay import BundleHeader, BundleWriter, read_bundle, replay
from toolfleet.agent.runner import AgentRunLimits, ToolRunner

__all__ = [
    "AgentEvent",
    "AgentRun",
    "AgentRunLimits",
    "AnthropicMessages",
    "BundleHeader",
    "BundleWriter",
    "CatalogTool",
    "ClientFleet",
    "EventKind",
    "FleetPort",
    "HttpFleet",
    "KafkaFleet",
    "MemoryFleet",
    "ModelRequest",
    "ModelTurn",
    "OpenAIChat",
    "OpenAIResponses",
    "ProviderAdapter",
    "RunCatalog",
    "StreamDecoder",
    "Submission",
    "Submitted",
    "ToolCall",
    "ToolEnvelope",
    "ToolRunner",
    "read_bundle",
    "replay",
    "run_agent",
]
