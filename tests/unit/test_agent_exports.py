"""``toolfleet.agent``'s public surface is pinned, and needs no provider package."""

from __future__ import annotations

import pytest

import toolfleet.agent
from tests.unit.test_install_extras import run_python
from toolfleet.cli.extras import EXTRA_OF_MODULE

pytestmark = pytest.mark.unit


def test_agent_exports() -> None:
    assert sorted(toolfleet.agent.__all__) == [
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
    for name in toolfleet.agent.__all__:
        assert getattr(toolfleet.agent, name).__doc__, f"toolfleet.agent.{name} has no docstring"


def test_the_runner_needs_no_provider_package_and_no_extra() -> None:
    """An agent platform runs the runner over HTTP on a core install."""
    done = run_python(
        """
        import sys
        import toolfleet.agent, toolfleet.cli.agent
        from toolfleet.agent import HttpFleet, KafkaFleet
        loaded = {"openai", "anthropic", "langchain_core"} & set(sys.modules)
        assert not loaded, loaded
        """,
        blocked=tuple(EXTRA_OF_MODULE),
    )
    assert done.returncode == 0, done.stderr
