"""toolfleet's SDK: write tools (``@tool``), and publish invocations (``ToolfleetClient``)."""

from toolfleet.events.models import Effect
from toolfleet.sdk.client import InvocationHandle, ToolfleetClient
from toolfleet.sdk.context import ToolContext
from toolfleet.sdk.policies import CachePolicy, CircuitPolicy, RetryPolicy
from toolfleet.sdk.tool import ToolSpec, tool

__all__ = [
    "CachePolicy",
    "CircuitPolicy",
    "Effect",
    "InvocationHandle",
    "RetryPolicy",
    "ToolContext",
    "ToolSpec",
    "ToolfleetClient",
    "tool",
]
