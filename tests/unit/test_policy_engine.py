"""Policy as data: deny by default, allowlists, agent narrowing, versions, approvals."""

from __future__ import annotations

from pathlib import Path

import pytest

from toolfleet.errors import PermissionDenied
from toolfleet.events.models import Effect
from toolfleet.policy.documents import PolicyDocument, TenantPolicy, load_policy
from toolfleet.policy.engine import PolicyQuery, decide, pinned_versions

pytestmark = pytest.mark.unit

DOC = PolicyDocument.model_validate(
    {
        "tenants": {
            "acme": {
                "allow_tools": ["core__*", "acme__*"],
                "deny_tools": ["acme__drop_*"],
                "tool_versions": {"acme__search": "^2.0.0"},
                "approval_effects": ["external_side_effect"],
                "agents": {"did:agent:intern": {"allow_tools": ["core__echo"]}},
            }
        }
    }
)


def query(tool: str = "core__echo", **kw: object) -> PolicyQuery:
    values: dict[str, object] = {
        "tenant_id": "acme",
        "agent_did": "did:agent:x",
        "tool_id": tool,
        "version": "1.0.0",
        "effect": Effect.READ_ONLY,
        "approval_requested": False,
    }
    values.update(kw)
    return PolicyQuery(**values)  # type: ignore[arg-type]


def test_allowed() -> None:
    assert decide(DOC, query()).needs_approval is False


@pytest.mark.parametrize(
    "q",
    [
        query(tenant_id="other"),  # no entry, no "*": deny by default
        query("billing__charge"),  # not in the allowlist
        query("acme__drop_table"),  # denied explicitly
        query("acme__search", version="1.9.0"),  # outside the allowed range
        query("core__get_current_time", agent_did="did:agent:intern"),  # narrowed for the agent
    ],
)
def test_denied(q: PolicyQuery) -> None:
    with pytest.raises(PermissionDenied):
        decide(DOC, q)


def test_empty_document_denies_everything() -> None:
    with pytest.raises(PermissionDenied):
        decide(PolicyDocument(), query())


def test_approvals_by_effect_or_request() -> None:
    assert decide(DOC, query("acme__mail", effect=Effect.EXTERNAL_SIDE_EFFECT)).needs_approval
    assert decide(DOC, query(approval_requested=True)).needs_approval


def test_wildcard_tenant_and_yaml_loading(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text('tenants:\n  "*":\n    allow_tools: ["core__*"]\n')
    doc = load_policy(path)
    assert decide(doc, query(tenant_id="anyone")).needs_approval is False
    assert load_policy(None) == PolicyDocument()


def test_unknown_keys_in_a_policy_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text('{"tenants": {"acme": {"allow_tool": ["core__*"]}}}')
    with pytest.raises(ValueError, match="allow_tool"):
        load_policy(path)


def test_only_exact_versions_in_tool_versions_pin_a_tool() -> None:
    tenant = TenantPolicy(
        allow_tools=["acme__*"],
        tool_versions={"acme__search": "1.2.0", "acme__*": "^2.0.0", "acme__fetch": "==3.1.4"},
    )
    assert pinned_versions(tenant, "acme__search") == {"1.2.0"}
    assert pinned_versions(tenant, "acme__fetch") == {"3.1.4"}
    assert pinned_versions(tenant, "acme__other") == frozenset()
    assert pinned_versions(None, "acme__search") == frozenset()


def test_a_tool_whose_manifest_requires_approval_always_waits_for_one() -> None:
    document = PolicyDocument.model_validate({"tenants": {"t1": {"allow_tools": ["acme__*"]}}})
    decision = decide(
        document,
        PolicyQuery(
            tenant_id="t1",
            agent_did="did:agent:a",
            tool_id="acme__pay",
            version="1.0.0",
            effect=Effect.READ_ONLY,
            approval_requested=False,
            tool_requires_approval=True,
        ),
    )
    assert decision.needs_approval
    assert decision.reason == "acme__pay requires approval for every call"
