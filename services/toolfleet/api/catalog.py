"""Whose catalog a caller sees: the registry as far as its tenant's policy allows and
its token grants.

``GET /v1/tools`` (search included), ``GET /v1/tools/{id}``, MCP's ``tools/list``, and
through them the console and the agent runner's catalog all list through
:func:`catalog_view`, so a tool is visible through one door exactly when it is through
the other, and only when a call to it could pass policy: a ``core__echo`` token is
shown ``core__echo`` alone.
"""

from __future__ import annotations

from toolfleet.api.auth import Caller
from toolfleet.api.resources import ApiResources
from toolfleet.policy.cache import RedisPolicyCache
from toolfleet.policy.catalog import CatalogView
from toolfleet.policy.postgres_policies import PolicyStore
from toolfleet.policy.provider import PolicyProvider
from toolfleet.sources.store import SourceStore


def policy_provider(res: ApiResources) -> PolicyProvider:
    """A provider for one request: Redis, then Postgres; no local layer to go stale."""
    return PolicyProvider(PolicyStore(res.pool), shared=RedisPolicyCache(res.redis), local_ttl_s=0)


async def catalog_view(res: ApiResources, caller: Caller) -> CatalogView:
    """An admin sees the whole registry; anyone else what its tenant's policy (with its
    agent's narrowing) allows. Either way only the tools the token's ``tool_id`` claim
    grants."""
    granted = caller.capability.tool_id
    if caller.is_admin:
        return CatalogView(policy=None, everything=True, granted=granted)
    policy = await policy_provider(res).policy_for(caller.tenant_id)
    return CatalogView(
        policy=policy,
        agent_did=caller.capability.agent_did,
        source_tools=await SourceStore(res.pool).tool_ids(),
        granted=granted,
    )
