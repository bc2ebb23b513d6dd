"""The tool manifest: fixed categories, one credentials list, lifecycle dates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel, ValidationError

from toolfleet.errors import RegistrationError
from toolfleet.events.models import Effect
from toolfleet.registry.manifest import LifecycleState, ToolManifest, ToolPermissions
from toolfleet.sdk import ToolContext, tool
from toolfleet.sdk.policies import CircuitPolicy, RetryPolicy
from toolfleet.sdk.tool import spec_of

pytestmark = pytest.mark.unit


def _manifest(**over: object) -> ToolManifest:
    values: dict[str, object] = {
        "tool_id": "acme__x",
        "version": "1.0.0",
        "effect": Effect.READ_ONLY,
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
        "redaction_allowlist": [],
        "timeout_seconds": 5,
        **over,
    }
    return ToolManifest.model_validate(values)


def test_categories_come_from_the_fixed_set() -> None:
    assert _manifest(category="finance").category == "finance"
    with pytest.raises(ValidationError):
        _manifest(category="misc")


def test_credentials_declared_either_way_are_one_list() -> None:
    old = _manifest(credentials=["api_key"])
    assert old.permissions.credentials == ["api_key"]
    new = _manifest(permissions=ToolPermissions(credentials=["token", "api_key"]))
    assert new.credentials == ["api_key", "token"]


def test_a_deprecated_version_sunsets_on_its_date() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    manifest = _manifest(lifecycle_state="deprecated", sunset_date=now + timedelta(days=1))
    assert manifest.state_at(now) is LifecycleState.DEPRECATED
    assert manifest.state_at(now + timedelta(days=1)) is LifecycleState.SUNSET


class _In(BaseModel):
    pass


class _Out(BaseModel):
    v: int


def test_a_tools_resilience_settings_reach_its_manifest() -> None:
    @tool(
        id="acme__resilient",
        version="1.0.0",
        effect="read_only",
        redaction_allowlist=["v"],
        retry=RetryPolicy(max_attempts=3),
        circuit="upstream",
        circuit_breaker=CircuitPolicy(failure_rate=0.2),
    )
    async def resilient(params: _In, ctx: ToolContext) -> _Out:
        return _Out(v=1)

    manifest = spec_of(resilient).manifest()
    assert manifest.retry_policy.max_attempts == 3
    assert (manifest.circuit.name, manifest.circuit.failure_rate) == ("upstream", 0.2)


def test_an_unknown_category_is_refused_at_declaration() -> None:
    with pytest.raises(RegistrationError, match="category 'misc'"):

        @tool(
            id="acme__odd",
            version="1.0.0",
            effect="read_only",
            redaction_allowlist=["v"],
            category="misc",
        )
        async def odd(params: _In, ctx: ToolContext) -> _Out:
            return _Out(v=1)
