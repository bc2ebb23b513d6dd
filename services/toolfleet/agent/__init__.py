"""``toolfleet.agent``: the agent side. A tool runner that speaks OpenAI and Anthropic.

The runner shows a model the tools its run may use, decodes the model's tool calls
(whole responses and streams), runs them through the fleet in parallel with
deterministic ids that double as idempotency keys, and feeds the results back in the
provider's shape. ``run_agent`` drives the loop; a bundle records it for ``replay``.
"""

from toolfleet.agent.adapters import ProviderAdapter, StreamDecoder
from toolfleet.agent.catalog import CatalogTool, RunCatalog
from toolfleet.agent.fleet import FleetPort, InMemoryFleet, Submission, Submitted
from toolfleet.agent.loop import AgentRun, ModelRequest, run_agent
from toolfleet.agent.providers import AnthropicMessages, OpenAIChat, OpenAIResponses
from toolfleet.agent.records import AgentEvent, EventKind, ModelTurn, ToolCall, ToolEnvelope
from toolfleet.agent.replay import BundleHeader, BundleWriter, read_bundle, replay
from toolfleet.agent.runner import RunLimits, ToolRunner

__all__ = [
    "AgentEvent",
    "AgentRun",
    "AnthropicMessages",
    "BundleHeader",
    "BundleWriter",
    "CatalogTool",
    "EventKind",
    "FleetPort",
    "InMemoryFleet",
    "ModelRequest",
    "ModelTurn",
    "OpenAIChat",
    "OpenAIResponses",
    "ProviderAdapter",
    "RunCatalog",
    "RunLimits",
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
