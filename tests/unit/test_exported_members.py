"""The public surfaces are pinned: changing one is a deliberate, reviewed act."""

from __future__ import annotations

from types import ModuleType

import pytest

import toolfleet.client
import toolfleet.sdk
import toolfleet.sdk.testing

pytestmark = pytest.mark.unit

SURFACES: dict[str, tuple[ModuleType, list[str]]] = {
    "sdk": (
        toolfleet.sdk,
        [
            "Breaker",
            "Cache",
            "Cancelled",
            "Document",
            "DocumentMetadata",
            "Effect",
            "FilesystemAccess",
            "Isolation",
            "Resilience",
            "ResourceDefaults",
            "Results",
            "Retry",
            "Sandbox",
            "SanitizeRule",
            "SearchHit",
            "ToolContext",
            "ToolLimits",
            "ToolPermissions",
            "ToolSpec",
            "command_tool",
            "spec_of",
            "tool",
        ],
    ),
    "sdk.testing": (
        toolfleet.sdk.testing,
        [
            "CallDocuments",
            "CheckpointRecorder",
            "DocumentContext",
            "DocumentRef",
            "LocalRun",
            "MemoryDocumentPins",
            "MemoryDocumentSource",
            "context_for",
            "run_tool",
        ],
    ),
    "client": (
        toolfleet.client,
        [
            "ApiError",
            "ApiUnavailable",
            "Client",
            "HttpClient",
            "InvocationEvent",
            "InvocationHandle",
            "KafkaClient",
            "KafkaPublisher",
            "NotSupportedByTransport",
            "Progress",
            "connect_http",
            "connect_kafka",
            "invoke_request",
        ],
    ),
}


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_exports(surface: str) -> None:
    module, expected = SURFACES[surface]
    assert sorted(module.__all__) == expected


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_every_export_exists_and_is_documented(surface: str) -> None:
    module, _ = SURFACES[surface]
    for name in module.__all__:
        member = getattr(module, name)
        assert member.__doc__, f"toolfleet.{surface}.{name} has no docstring"


def test_no_undeclared_public_members_in_the_sdk() -> None:
    public = {
        name
        for name, value in vars(toolfleet.sdk).items()
        if not name.startswith("_") and not isinstance(value, ModuleType)  # submodules
    }
    assert public == set(toolfleet.sdk.__all__)


def test_the_sdk_no_longer_carries_the_producer_client() -> None:
    # Producers import toolfleet.client; tool authors' installs stay light.
    assert not hasattr(toolfleet.sdk, "ToolfleetClient")
