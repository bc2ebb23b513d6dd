"""Which registry entries a caller may see (pure): the tools its tenant's policy allows
that its token also grants (the token's ``tool_id`` claim, a glob)."""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from toolfleet.policy.documents import TenantPolicy
from toolfleet.policy.engine import allows_tool

ToolRows = tuple[list[dict[str, Any]], int]
"""A page of registry summaries (each with ``tool_id``) and the total matching count."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CatalogView:
    """Whose catalog: ``policy`` ``None`` with ``everything`` False shows nothing."""

    policy: TenantPolicy | None
    agent_did: str | None = None
    everything: bool = False
    """Admins see the whole registry."""
    source_tools: frozenset[str] = frozenset()
    """Ids of tools registered from MCP or HTTP sources: shown only when named exactly."""
    granted: str = "*"
    """The token's ``tool_id`` claim: only tools it matches are shown, whatever the policy
    allows (policy would refuse a call to any other, so it is not offered)."""

    def shows(self, tool_id: str) -> bool:
        if not fnmatch.fnmatchcase(tool_id, self.granted):
            return False
        return self.everything or allows_tool(
            self.policy,
            tool_id,
            agent_did=self.agent_did,
            source_tool=tool_id in self.source_tools,
        )


async def visible_page(
    view: CatalogView,
    fetch: Callable[[int, int], Awaitable[ToolRows]],
    *,
    offset: int,
    limit: int,
    chunk: int = 500,
) -> ToolRows:
    """One page of the tools ``view`` shows, and how many it shows in all.

    ``fetch(limit, offset)`` pages the already filtered registry (category, tag, text).
    Policies are globs, so filtering happens here, over the whole filtered registry: it
    holds tools, not invocations, and stays small.
    """
    if view.everything and view.granted == "*":
        return await fetch(limit, offset)
    shown: list[dict[str, Any]] = []
    start = 0
    while True:
        rows, total = await fetch(chunk, start)
        shown += [r for r in rows if view.shows(str(r["tool_id"]))]
        start += len(rows)
        if not rows or start >= total:
            break
    return _slice(shown, offset, limit), len(shown)


def _slice(rows: Sequence[dict[str, Any]], offset: int, limit: int) -> list[dict[str, Any]]:
    return list(rows[offset : offset + limit])
