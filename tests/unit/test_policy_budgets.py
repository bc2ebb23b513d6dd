"""Effective budgets: tool over agent over tenant, field by field; decide() returns them."""

from __future__ import annotations

import pytest

from toolfleet.errors import PermissionDenied
from toolfleet.events.models import Effect
from toolfleet.policy.documents import Budgets, PolicyDocument, TenantPolicy
from toolfleet.policy.engine import (
    PolicyDecision,
    PolicyQuery,
    allows_tool,
    decide,
    decide_tenant,
    effective_budgets,
)

pytestmark = pytest.mark.unit

ACME = TenantPolicy.model_validate(
    {
        "allow_tools": ["core__*", "acme__*"],
        "deny_tools": ["acme__drop_*"],
        "budgets": {"max_runtime_ms": 1000, "max_result_bytes": 1000, "max_calls_per_minute": 100},
        "tool_budgets": {
            "acme__*": {"max_runtime_ms": 2000},
            "acme__search*": {"max_runtime_ms": 3000, "max_calls_per_minute": 7},
            "acme__search": {"max_result_bytes": 50},
        },
        "agents": {
            "did:agent:slow": {"budgets": {"max_runtime_ms": 9000, "max_calls_per_minute": 1}},
            "did:agent:intern": {"allow_tools": ["core__echo"]},
        },
        "max_concurrent_per_agent": 2,
        "approval_ttl_s": 120,
    }
)


def query(tool: str = "core__echo", agent: str = "did:agent:x", **kw: object) -> PolicyQuery:
    values: dict[str, object] = {
        "tenant_id": "acme",
        "agent_did": agent,
        "tool_id": tool,
        "version": "1.0.0",
        "effect": Effect.READ_ONLY,
        "approval_requested": False,
    }
    values.update(kw)
    return PolicyQuery(**values)  # type: ignore[arg-type]


def test_tenant_budgets_apply_when_nothing_more_specific_does() -> None:
    assert effective_budgets(ACME, agent_did="did:agent:x", tool_id="core__echo") == Budgets(
        max_runtime_ms=1000, max_result_bytes=1000, max_calls_per_minute=100
    )


def test_agent_overrides_tenant() -> None:
    assert effective_budgets(ACME, agent_did="did:agent:slow", tool_id="core__echo") == Budgets(
        max_runtime_ms=9000, max_result_bytes=1000, max_calls_per_minute=1
    )


def test_tool_overrides_agent_and_tenant() -> None:
    got = effective_budgets(ACME, agent_did="did:agent:slow", tool_id="acme__mail")
    assert got == Budgets(max_runtime_ms=2000, max_result_bytes=1000, max_calls_per_minute=1)


def test_most_specific_tool_pattern_wins() -> None:
    # literal acme__search > glob acme__search* > glob acme__*, each field on its own
    got = effective_budgets(ACME, agent_did="did:agent:slow", tool_id="acme__search")
    assert got == Budgets(max_runtime_ms=3000, max_result_bytes=50, max_calls_per_minute=7)


def test_decide_returns_the_effective_limits() -> None:
    decision = decide(PolicyDocument(tenants={"acme": ACME}), query("acme__search"))
    assert decision == PolicyDecision(
        needs_approval=False,
        reason="allowed by policy",
        budgets=Budgets(max_runtime_ms=3000, max_result_bytes=50, max_calls_per_minute=7),
        max_concurrent_per_agent=2,
        approval_ttl_s=120,
    )


def test_decide_defaults_without_budgets() -> None:
    decision = decide_tenant(TenantPolicy(allow_tools=["core__*"]), query())
    assert decision.budgets == Budgets()
    assert decision.max_concurrent_per_agent == 4
    assert decision.approval_ttl_s is None


def test_decide_tenant_none_denies() -> None:
    with pytest.raises(PermissionDenied):
        decide_tenant(None, query())


@pytest.mark.parametrize(
    ("tool", "agent", "shown"),
    [
        ("core__echo", None, True),
        ("acme__search", None, True),
        ("acme__drop_all", None, False),
        ("billing__charge", None, False),
        ("core__get_current_time", "did:agent:intern", False),
        ("core__echo", "did:agent:intern", True),
        ("core__get_current_time", "did:agent:unlisted", True),
    ],
)
def test_allows_tool_for_the_catalog(tool: str, agent: str | None, shown: bool) -> None:
    assert allows_tool(ACME, tool, agent_did=agent) is shown


def test_allows_nothing_without_policy() -> None:
    assert allows_tool(None, "core__echo") is False
