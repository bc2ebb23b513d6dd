"""The tool manifest: fixed categories, one credentials list, lifecycle dates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import BaseModel, ValidationError

from toolfleet.contract.manifest import (
    FilesystemAccess,
    LifecycleState,
    ResourceDefaults,
    SourceType,
    ToolManifest,
    ToolPermissions,
)
from toolfleet.errors import RegistrationError
from toolfleet.events.models import Effect
from toolfleet.sdk import (
    Breaker,
    Cache,
    Resilience,
    Retry,
    Sandbox,
    ToolContext,
    ToolLimits,
    tool,
)
from toolfleet.tools.spec import spec_of

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
        resilience=Resilience(
            retry=Retry(max_attempts=3),
            circuit=Breaker(name="upstream", failure_rate=0.2),
        ),
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


def test_what_a_tool_needs_and_how_it_runs_reach_its_manifest() -> None:
    @tool(
        id="acme__pay",
        version="1.0.0",
        effect="external_side_effect",
        redaction_allowlist=["v"],
        requires_approval=True,
        sandbox=Sandbox(
            limits=ToolLimits(cpu_millicores=500, memory_mb=256),
            permissions=ToolPermissions(
                filesystem=[FilesystemAccess(path="/data/*", access="write")],
                network=["api.example.com"],
                credentials=["signing_key", "api_key"],
            ),
        ),
    )
    async def pay(params: _In, ctx: ToolContext) -> _Out:
        return _Out(v=1)

    spec = spec_of(pay)
    manifest = spec.manifest()
    assert manifest.requires_approval
    assert manifest.source_type is SourceType.NATIVE
    assert manifest.permissions.filesystem == [FilesystemAccess(path="/data/*", access="write")]
    assert manifest.permissions.network == ["api.example.com"]
    # One list, kept twice in the manifest, and the executor resolves all of it.
    assert manifest.permissions.credentials == sorted(manifest.credentials)
    assert manifest.permissions.credentials == ["api_key", "signing_key"]
    assert spec.credentials == ("signing_key", "api_key")
    # Limits are stated once: what a call needs; the manifest's defaults stay unset.
    assert spec.limits == ToolLimits(cpu_millicores=500, memory_mb=256)
    assert manifest.resource_defaults == ResourceDefaults()
    dumped = manifest.model_dump(mode="json")
    assert dumped["source_type"] == "native"
    assert dumped["permissions"]["filesystem"] == [{"path": "/data/*", "access": "write"}]


def test_a_tool_declares_nothing_it_does_not_say() -> None:
    @tool(id="acme__plain", version="1.0.0", effect="read_only", redaction_allowlist=["v"])
    async def plain(params: _In, ctx: ToolContext) -> _Out:
        return _Out(v=1)

    manifest = spec_of(plain).manifest()
    assert not manifest.requires_approval
    assert manifest.permissions == ToolPermissions()
    assert manifest.resource_defaults == ResourceDefaults()
    assert manifest.source_type is SourceType.NATIVE


def test_a_permission_credential_with_a_bad_name_is_refused() -> None:
    with pytest.raises(RegistrationError, match="acme__bad"):

        @tool(
            id="acme__bad",
            version="1.0.0",
            effect="read_only",
            redaction_allowlist=["v"],
            sandbox=Sandbox(permissions=ToolPermissions(credentials=["Not A Name"])),
        )
        async def bad(params: _In, ctx: ToolContext) -> _Out:
            return _Out(v=1)


def test_a_tool_with_credentials_in_its_permissions_cannot_be_cached() -> None:
    with pytest.raises(RegistrationError, match="cannot be cached"):

        @tool(
            id="acme__cached",
            version="1.0.0",
            effect="read_only",
            redaction_allowlist=["v"],
            sandbox=Sandbox(permissions=ToolPermissions(credentials=["api_key"])),
            resilience=Resilience(cache=Cache(mode="ttl", ttl_s=60)),
        )
        async def cached(params: _In, ctx: ToolContext) -> _Out:
            return _Out(v=1)
