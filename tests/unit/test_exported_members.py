"""The public SDK surface is pinned: changing it is a deliberate, reviewed act."""

from __future__ import annotations

import pytest

import toolfleet.sdk

pytestmark = pytest.mark.unit


def test_sdk_exports() -> None:
    assert sorted(toolfleet.sdk.__all__) == [
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


def test_every_export_exists_and_is_documented() -> None:
    for name in toolfleet.sdk.__all__:
        member = getattr(toolfleet.sdk, name)
        assert member.__doc__, f"toolfleet.sdk.{name} has no docstring"


def test_no_undeclared_public_members() -> None:
    public = {
        name
        for name, value in vars(toolfleet.sdk).items()
        if not name.startswith("_") and not isinstance(value, type(toolfleet))  # submodules
    }
    assert public == set(toolfleet.sdk.__all__)
