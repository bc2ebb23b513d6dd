"""The policy decision for one resolved request (pure logic)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from toolfleet.errors import PermissionDenied
from toolfleet.events.models import Effect
from toolfleet.policy.documents import (
    NO_BUDGETS,
    Budgets,
    PolicyDocument,
    TenantPolicy,
    allowed_by,
    is_glob,
    matches_any,
)
from toolfleet.registry.versions import exact_version, matches


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyQuery:
    tenant_id: str
    agent_did: str
    tool_id: str
    version: str
    effect: Effect
    approval_requested: bool
    tool_requires_approval: bool = False
    """The tool's manifest says every call waits for an approver."""
    source_tool: bool = False
    """The tool comes from an MCP or HTTP source: only its exact id allows it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyDecision:
    """An allowed call: whether it waits for a human, and the limits it runs under."""

    needs_approval: bool
    """Park the call until an approver decides."""
    reason: str
    """Why (shown in ``approval.requested`` events)."""
    budgets: Budgets = NO_BUDGETS
    """Effective budgets (tool over agent over tenant); ``None`` fields are unlimited."""
    max_concurrent_per_agent: int = 4
    """Calls this agent may have running at once."""
    approval_ttl_s: int | None = None
    """How long an approval may take; ``None`` keeps the service's default."""


def decide(document: PolicyDocument, query: PolicyQuery) -> PolicyDecision:
    """Allow with or without approval, or raise :class:`PermissionDenied`."""
    return decide_tenant(document.for_tenant(query.tenant_id), query)


def decide_tenant(tenant: TenantPolicy | None, query: PolicyQuery) -> PolicyDecision:
    """:func:`decide` given the tenant's effective policy (``None``: deny everything).

    This is the call when the policy comes from
    :meth:`toolfleet.policy.provider.PolicyProvider.policy_for`.
    """
    if tenant is None:
        raise PermissionDenied("no policy allows any tool for this tenant")
    untrusted = query.source_tool
    if not allowed_by(query.tool_id, tenant.allow_tools, source_tool=untrusted) or matches_any(
        query.tool_id, tenant.deny_tools
    ):
        raise PermissionDenied(f"policy does not allow {query.tool_id} for this tenant")
    agent = tenant.agents.get(query.agent_did)
    if agent is not None:
        if agent.allow_tools is not None and not allowed_by(
            query.tool_id, agent.allow_tools, source_tool=untrusted
        ):
            raise PermissionDenied(f"policy does not allow {query.tool_id} for this agent")
        if matches_any(query.tool_id, agent.deny_tools):
            raise PermissionDenied(f"policy does not allow {query.tool_id} for this agent")
    for pattern, allowed_range in tenant.tool_versions.items():
        if matches_any(query.tool_id, [pattern]) and not matches(allowed_range, query.version):
            raise PermissionDenied(
                f"policy allows {query.tool_id} only in versions {allowed_range}"
            )
    if query.tool_requires_approval:
        needs_approval, reason = True, f"{query.tool_id} requires approval for every call"
    elif query.approval_requested:
        needs_approval, reason = True, "the request asked for approval"
    elif query.effect in tenant.approval_effects:
        needs_approval, reason = True, f"policy requires approval for {query.effect} tools"
    else:
        needs_approval, reason = False, "allowed by policy"
    return PolicyDecision(
        needs_approval=needs_approval,
        reason=reason,
        budgets=effective_budgets(tenant, agent_did=query.agent_did, tool_id=query.tool_id),
        max_concurrent_per_agent=tenant.max_concurrent_per_agent,
        approval_ttl_s=tenant.approval_ttl_s,
    )


def pinned_versions(tenant: TenantPolicy | None, tool_id: str) -> frozenset[str]:
    """The exact versions of ``tool_id`` the tenant pins in ``tool_versions`` (``"1.0.0"``).

    Only a pin lets a sunset version run: a range (``^1.0``) does not.
    """
    if tenant is None:
        return frozenset()
    pins = (
        exact_version(allowed)
        for pattern, allowed in tenant.tool_versions.items()
        if matches_any(tool_id, [pattern])
    )
    return frozenset(p for p in pins if p is not None)


def allows_tool(
    tenant: TenantPolicy | None,
    tool_id: str,
    *,
    agent_did: str | None = None,
    source_tool: bool = False,
) -> bool:
    """Whether ``tool_id`` (in some version) is callable under ``tenant`` (catalog filter).

    The agent's narrowing applies when ``agent_did`` has an entry. Version ranges are not
    considered: a tool allowed in some versions is listed. ``source_tool``: as in
    :class:`PolicyQuery`.
    """
    if tenant is None:
        return False
    if not allowed_by(tool_id, tenant.allow_tools, source_tool=source_tool) or matches_any(
        tool_id, tenant.deny_tools
    ):
        return False
    agent = tenant.agents.get(agent_did) if agent_did is not None else None
    if agent is None:
        return True
    if agent.allow_tools is not None and not allowed_by(
        tool_id, agent.allow_tools, source_tool=source_tool
    ):
        return False
    return not matches_any(tool_id, agent.deny_tools)


def effective_budgets(tenant: TenantPolicy, *, agent_did: str, tool_id: str) -> Budgets:
    """The budgets of one call, merged field by field; the most specific setting wins.

    Precedence: ``tool_budgets`` (tool) > ``agents.<did>.budgets`` (agent) > ``budgets``
    (tenant). When several ``tool_budgets`` patterns match, a literal id wins over globs
    and a longer glob over a shorter one (``acme__search*`` over ``acme__*``).
    """
    merged = tenant.budgets
    agent = tenant.agents.get(agent_did)
    if agent is not None:
        merged = agent.budgets.over(merged)
    matching = [p for p in tenant.tool_budgets if fnmatch.fnmatchcase(tool_id, p)]
    for pattern in sorted(matching, key=lambda p: (not is_glob(p), len(p), p)):
        merged = tenant.tool_budgets[pattern].over(merged)
    return merged


MAX_CACHED_POLICIES = 10_000
"""Tenant policies a :class:`DecisionCache` keeps decisions for (cleared when exceeded)."""
MAX_DECISIONS_PER_POLICY = 10_000
"""Decisions kept per policy (that policy's are cleared when exceeded)."""


class DecisionCache:
    """:func:`decide_tenant` and :func:`pinned_versions`, remembered per policy.

    Both are pure functions of the policy and the query, and a policy never changes in
    place (it is frozen; a changed policy is a new object, loaded after the
    ``policy:updates`` push dropped the old one), so answers are kept per policy
    *object* and a new version starts empty. A refusal is remembered as its message
    and raised anew each time.
    """

    def __init__(self) -> None:
        self._policies: dict[int, _PolicyAnswers] = {}

    def decide(self, tenant: TenantPolicy | None, query: PolicyQuery) -> PolicyDecision:
        """:func:`decide_tenant`, or its remembered answer for this policy and query."""
        if tenant is None:
            return decide_tenant(tenant, query)
        answers = self._answers(tenant)
        hit = answers.decisions.get(query)
        if hit is None:
            try:
                hit = decide_tenant(tenant, query)
            except PermissionDenied as exc:
                hit = exc.message
            if len(answers.decisions) >= MAX_DECISIONS_PER_POLICY:
                answers.decisions.clear()
            answers.decisions[query] = hit
        if isinstance(hit, str):
            raise PermissionDenied(hit)
        return hit

    def pinned(self, tenant: TenantPolicy | None, tool_id: str) -> frozenset[str]:
        """:func:`pinned_versions`, remembered for this policy and tool."""
        if tenant is None:
            return frozenset()
        answers = self._answers(tenant)
        hit = answers.pins.get(tool_id)
        if hit is None:
            if len(answers.pins) >= MAX_DECISIONS_PER_POLICY:
                answers.pins.clear()
            hit = answers.pins[tool_id] = pinned_versions(tenant, tool_id)
        return hit

    def _answers(self, tenant: TenantPolicy) -> _PolicyAnswers:
        # By identity; the entry holds the policy, so its id is not reused meanwhile.
        answers = self._policies.get(id(tenant))
        if answers is None or answers.policy is not tenant:
            if len(self._policies) >= MAX_CACHED_POLICIES:
                self._policies.clear()
            answers = self._policies[id(tenant)] = _PolicyAnswers(policy=tenant)
        return answers


@dataclass(slots=True, kw_only=True)
class _PolicyAnswers:
    policy: TenantPolicy
    decisions: dict[PolicyQuery, PolicyDecision | str] = field(default_factory=dict)
    pins: dict[str, frozenset[str]] = field(default_factory=dict)
