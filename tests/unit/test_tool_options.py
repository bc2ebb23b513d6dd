"""``@tool``'s option groups: each concept in one place, checked where it is written."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from toolfleet.contract.manifest import ResourceDefaults
from toolfleet.errors import RegistrationError
from toolfleet.sdk import (
    Breaker,
    Cache,
    FilesystemAccess,
    Isolation,
    Resilience,
    Results,
    Retry,
    Sandbox,
    SanitizeRule,
    ToolContext,
    ToolLimits,
    ToolPermissions,
    spec_of,
    tool,
)

pytestmark = pytest.mark.unit


class In(BaseModel):
    q: str


class Out(BaseModel):
    body: str


def declare(**options: Any) -> Any:
    async def fn(params: In, ctx: ToolContext) -> Out:
        return Out(body=params.q)

    fn.__module__ = "acme_tools"  # a tool from outside toolfleet
    return tool(id="acme__fn", version="1.0.0", effect="read_only", redaction_allowlist=["body"],
                **options)(fn)  # fmt: skip


def test_every_group_reaches_the_manifest_as_before() -> None:
    fn = declare(
        results=Results(
            validation="coerce",
            sanitize={"$.body": SanitizeRule(action="escape", checks=("html",)), "*": "reject"},
            max_bytes=4096,
        ),
        resilience=Resilience(
            retry=Retry(max_attempts=3),
            circuit=Breaker(name="api.example.com", failure_rate=0.25),
            cache=Cache(mode="forever"),
        ),
        sandbox=Sandbox(
            isolation="process",
            limits=ToolLimits(memory_mb=256),
            permissions=ToolPermissions(
                network=["api.example.com"],
                filesystem=[FilesystemAccess(path="/data/*")],
            ),
        ),
    )
    spec = spec_of(fn)
    manifest = spec.manifest()
    assert manifest.result_rules.mode == "coerce"
    assert manifest.result_rules.sanitize["$.body"].checks == ("html",)
    assert manifest.result_rules.sanitize["*"].action == "reject"
    assert manifest.result_rules.max_bytes == 4096
    assert manifest.retry_policy.max_attempts == 3
    assert (manifest.circuit.name, manifest.circuit.failure_rate) == ("api.example.com", 0.25)
    assert spec.circuit_name == "api.example.com"
    assert spec.cache == Cache(mode="forever")
    assert manifest.isolation == "process"
    assert spec.isolation is Isolation.PROCESS
    assert spec.limits == ToolLimits(memory_mb=256)
    assert manifest.resource_defaults == ResourceDefaults()
    assert manifest.permissions.network == ["api.example.com"]


def test_the_defaults_are_the_old_defaults() -> None:
    spec = spec_of(declare())
    manifest = spec.manifest()
    assert manifest.result_rules.mode == "strict"
    assert manifest.result_rules.sanitize == {}
    assert manifest.circuit.name == "acme__fn"
    assert manifest.retry_policy.max_attempts == 1
    assert spec.cache is None
    assert spec.isolation is Isolation.SANDBOX
    assert spec.credentials == ()


def test_credentials_are_declared_once_in_the_permissions() -> None:
    spec = spec_of(
        declare(sandbox=Sandbox(permissions=ToolPermissions(credentials=["token", "api_key"])))
    )
    assert spec.credentials == ("token", "api_key")
    assert spec.manifest().credentials == ["token", "api_key"]
    assert spec.manifest().permissions.credentials == ["api_key", "token"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Results(validation="lenient"), "invalid result rules: validation"),
        (lambda: Results(max_bytes=0), "invalid result rules: max_bytes"),
        (lambda: Results(sanitize="escape"), "maps field paths"),
        (lambda: Resilience(retry={"max_attempts": 3}), "Resilience.retry takes a Retry"),
        (lambda: Resilience(cache="ttl"), "Resilience.cache takes a Cache or None"),
        (lambda: Breaker(name="has space"), "Breaker.name"),
        (lambda: Sandbox(isolation="vm"), "Sandbox.isolation must be one of"),
        (lambda: Sandbox(limits={"memory_mb": 1}), "Sandbox.limits takes a ToolLimits"),
        (lambda: Sandbox(permissions={}), "Sandbox.permissions takes a ToolPermissions"),
        (lambda: ToolLimits(memory_mb=0), "ToolLimits.memory_mb is a positive integer"),
        (lambda: ToolLimits(cpu_millicores=1.5), "ToolLimits.cpu_millicores"),
    ],
)
def test_a_bad_option_is_refused_where_it_is_written(make: Any, message: str) -> None:
    with pytest.raises(RegistrationError, match=message):
        make()


@pytest.mark.parametrize("group", ["results", "resilience", "sandbox"])
def test_a_group_of_the_wrong_type_is_refused(group: str) -> None:
    with pytest.raises(RegistrationError, match=f"acme__fn: {group}= takes a"):
        declare(**{group: {"validation": "coerce"}})


@pytest.mark.parametrize(
    "old",
    ["credentials", "circuit", "circuit_breaker", "retry", "cache", "result_validation",
     "sanitize", "max_result_bytes", "permissions", "resource_defaults", "isolation", "limits"],
)  # fmt: skip
def test_the_old_flat_keywords_are_gone(old: str) -> None:
    with pytest.raises(TypeError, match=old):
        declare(**{old: None})


def test_a_tool_with_credentials_cannot_have_a_cache() -> None:
    with pytest.raises(RegistrationError, match="cannot be cached"):
        declare(
            resilience=Resilience(cache=Cache()),
            sandbox=Sandbox(permissions=ToolPermissions(credentials=["api_key"])),
        )
