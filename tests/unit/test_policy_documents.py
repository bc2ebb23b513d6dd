"""Policy documents: the budget fields, strictness, and unknown-tool rejection."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from toolfleet.errors import ErrorCode
from toolfleet.policy.documents import (
    Budgets,
    PolicyDocument,
    TenantPolicy,
    UnknownTools,
    check_known_tools,
    unknown_tools,
)

pytestmark = pytest.mark.unit

KNOWN = {"core__echo", "core__get_current_time", "acme__search"}


def test_new_fields_have_safe_defaults() -> None:
    policy = TenantPolicy()
    assert policy.budgets == Budgets()
    assert policy.tool_budgets == {}
    assert policy.max_concurrent_per_agent == 4
    assert policy.approval_ttl_s is None


def test_full_document_parses() -> None:
    doc = PolicyDocument.model_validate(
        {
            "tenants": {
                "acme": {
                    "allow_tools": ["acme__*"],
                    "budgets": {"max_runtime_ms": 1000, "max_calls_per_minute": 60},
                    "tool_budgets": {"acme__*": {"max_result_bytes": 2048}},
                    "max_concurrent_per_agent": 2,
                    "approval_ttl_s": 600,
                    "agents": {"did:agent:a": {"budgets": {"max_calls_per_minute": 5}}},
                }
            }
        }
    )
    acme = doc.tenants["acme"]
    assert acme.budgets.max_runtime_ms == 1000
    assert acme.tool_budgets["acme__*"].max_result_bytes == 2048
    assert acme.agents["did:agent:a"].budgets.max_calls_per_minute == 5


@pytest.mark.parametrize(
    "data",
    [
        {"budgets": {"max_runtime": 5}},  # unknown budget key
        {"budgets": {"max_runtime_ms": 0}},  # budgets are positive
        {"max_concurrent_per_agent": 0},
        {"approval_ttl_s": -1},
        {"agents": {"did:agent:a": {"budget": {}}}},
    ],
)
def test_invalid_documents_are_rejected(data: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        TenantPolicy.model_validate(data)


def test_budgets_over_keeps_unset_fields_of_the_base() -> None:
    base = Budgets(max_runtime_ms=10, max_result_bytes=20)
    assert Budgets(max_runtime_ms=5).over(base) == Budgets(max_runtime_ms=5, max_result_bytes=20)


def test_literal_unknown_tools_are_reported_everywhere_with_their_location() -> None:
    policy = TenantPolicy.model_validate(
        {
            "allow_tools": ["core__*", "core__echo", "core__ecko"],
            "deny_tools": ["acme__drop"],
            "tool_versions": {"acme__serch": "^2"},
            "tool_budgets": {"acme__*": {}, "nope__x": {}},
            "agents": {"did:agent:a": {"allow_tools": ["core__tiem"], "deny_tools": ["x__y"]}},
        }
    )
    assert unknown_tools(policy, KNOWN) == {
        "allow_tools.2": "core__ecko",
        "deny_tools.0": "acme__drop",
        "tool_versions.acme__serch": "acme__serch",
        "tool_budgets.nope__x": "nope__x",
        "agents.did:agent:a.allow_tools.0": "core__tiem",
        "agents.did:agent:a.deny_tools.0": "x__y",
    }
    with pytest.raises(UnknownTools) as caught:
        check_known_tools(policy, KNOWN)
    assert caught.value.code == ErrorCode.INVALID_PARAMETERS
    assert caught.value.tool_ids == sorted(
        ["core__ecko", "acme__drop", "acme__serch", "nope__x", "core__tiem", "x__y"]
    )
    assert "core__ecko" in caught.value.message


def test_globs_and_known_ids_pass() -> None:
    policy = TenantPolicy(allow_tools=["core__*", "acme__sea?ch", "acme__[st]*", "core__echo"])
    check_known_tools(policy, KNOWN)
    check_known_tools(TenantPolicy(), set())
