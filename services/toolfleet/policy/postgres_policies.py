"""Tenant policies in Postgres (``tool_policies``, ``tool_policy_history``).

Every write bumps the tenant's ``version`` and appends the document to the history in
the same transaction. Writers may pass the version they read (optimistic concurrency);
a stale one is refused with :class:`PolicyVersionConflict`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from toolfleet.errors import StateConflict
from toolfleet.policy.documents import PolicyDocument, TenantPolicy, VersionedPolicy


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyRecord:
    """One stored version of a tenant's policy, with who wrote it and when."""

    tenant_id: str
    policy: TenantPolicy
    version: int
    updated_at: datetime
    updated_by: str


__all__ = [
    "SEED_AUTHOR",
    "PolicyRecord",
    "PolicyStore",
    "PolicyVersionConflict",
    "VersionedPolicy",
    "registered_tool_ids",
    "seed_from_document",
]


class PolicyVersionConflict(StateConflict):
    """The policy changed since the writer read it (or exists when it should not)."""


class PolicyStore:
    """The only code touching the policy tables."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def get(self, tenant_id: str) -> VersionedPolicy | None:
        """The tenant's own policy (no ``"*"`` fallback) and its version, if stored."""
        record = await self.record(tenant_id)
        return None if record is None else VersionedPolicy(record.policy, record.version)

    async def record(self, tenant_id: str) -> PolicyRecord | None:
        """The tenant's current policy with its metadata, if stored."""
        row = await self._pool.fetchrow(
            """SELECT tenant_id, document, version, updated_at, updated_by
               FROM tool_policies WHERE tenant_id = $1""",
            tenant_id,
        )
        return None if row is None else _record(row)

    async def all(self) -> dict[str, VersionedPolicy]:
        """Every stored tenant policy, by tenant id."""
        rows = await self._pool.fetch(
            "SELECT tenant_id, document, version, updated_at, updated_by FROM tool_policies"
        )
        records = (_record(r) for r in rows)
        return {r.tenant_id: VersionedPolicy(r.policy, r.version) for r in records}

    async def document(self) -> PolicyDocument:
        """All stored policies as one document (what the policy file used to hold)."""
        return PolicyDocument(tenants={t: v.policy for t, v in (await self.all()).items()})

    async def history(self, tenant_id: str) -> list[PolicyRecord]:
        """Every version ever written for the tenant, oldest first."""
        rows = await self._pool.fetch(
            """SELECT tenant_id, document, version, updated_at, updated_by
               FROM tool_policy_history WHERE tenant_id = $1 ORDER BY version""",
            tenant_id,
        )
        return [_record(r) for r in rows]

    async def put(
        self,
        tenant_id: str,
        policy: TenantPolicy,
        updated_by: str,
        *,
        expected_version: int | None = None,
    ) -> int:
        """Store ``policy`` for the tenant; return its new version (see :meth:`write`)."""
        record = await self.write(tenant_id, policy, updated_by, expected_version=expected_version)
        return record.version

    async def write(
        self,
        tenant_id: str,
        policy: TenantPolicy,
        updated_by: str,
        *,
        expected_version: int | None = None,
    ) -> PolicyRecord:
        """Store ``policy`` for the tenant; return what was stored, with its new version.

        Args:
            expected_version: the version the writer based its change on; ``0`` means the
                tenant must have no policy yet; ``None`` writes unconditionally.

        Raises:
            PolicyVersionConflict: ``expected_version`` is not the stored version.
        """
        document = policy.model_dump(mode="json")
        async with self._pool.acquire() as conn, conn.transaction():
            if expected_version is None:
                row = await conn.fetchrow(
                    """INSERT INTO tool_policies (tenant_id, document, version, updated_by)
                       VALUES ($1, $2, 1, $3)
                       ON CONFLICT (tenant_id) DO UPDATE SET document = EXCLUDED.document,
                           version = tool_policies.version + 1, updated_at = now(),
                           updated_by = EXCLUDED.updated_by
                       RETURNING version, updated_at""",
                    tenant_id,
                    document,
                    updated_by,
                )
            elif expected_version == 0:
                row = await conn.fetchrow(
                    """INSERT INTO tool_policies (tenant_id, document, version, updated_by)
                       VALUES ($1, $2, 1, $3) ON CONFLICT (tenant_id) DO NOTHING
                       RETURNING version, updated_at""",
                    tenant_id,
                    document,
                    updated_by,
                )
            else:
                row = await conn.fetchrow(
                    """UPDATE tool_policies SET document = $2, version = version + 1,
                           updated_at = now(), updated_by = $3
                       WHERE tenant_id = $1 AND version = $4
                       RETURNING version, updated_at""",
                    tenant_id,
                    document,
                    updated_by,
                    expected_version,
                )
            if row is None:
                current = await conn.fetchval(
                    "SELECT version FROM tool_policies WHERE tenant_id = $1", tenant_id
                )
                raise PolicyVersionConflict(
                    f"the policy of {tenant_id!r} is at version {current or 0}, "
                    f"not {expected_version}; read it again and retry",
                    details={"current_version": current or 0},
                )
            await conn.execute(
                """INSERT INTO tool_policy_history
                       (tenant_id, version, document, updated_at, updated_by)
                   VALUES ($1, $2, $3, $4, $5)""",
                tenant_id,
                row["version"],
                document,
                row["updated_at"],
                updated_by,
            )
            return PolicyRecord(
                tenant_id=tenant_id,
                policy=policy,
                version=int(row["version"]),
                updated_at=row["updated_at"],
                updated_by=updated_by,
            )


async def registered_tool_ids(pool: asyncpg.Pool) -> frozenset[str]:
    """Every tool id in the registry (what a policy may name literally)."""
    rows = await pool.fetch("SELECT tool_id FROM tool_definitions")
    return frozenset(r["tool_id"] for r in rows)


SEED_AUTHOR = "seed:policy-file"
"""``updated_by`` of policies applied from ``TOOLFLEET_POLICY_FILE``."""


async def seed_from_document(
    store: PolicyStore,
    document: PolicyDocument,
    *,
    updated_by: str = SEED_AUTHOR,
    announce: Callable[[str], Awaitable[None]] | None = None,
) -> dict[str, int]:
    """Apply the policy file's tenants to Postgres; return the tenants written.

    A tenant with no stored policy gets the file's. A tenant whose stored policy came
    from the file (``updated_by`` is the seed author) follows the file when it changes.
    A tenant whose policy was written through the API is left alone: operators' changes
    win over the file. Safe to call from every process at once (versions are checked).

    Args:
        announce: called with each written tenant id, e.g.
            :meth:`toolfleet.policy.cache.RedisPolicyCache.announce`, so caches drop it.
    """
    applied: dict[str, int] = {}
    for tenant_id, policy in document.tenants.items():
        current = await store.record(tenant_id)
        if current is None:
            expected = 0
        elif current.updated_by == updated_by and current.policy != policy:
            expected = current.version
        else:
            continue
        try:
            applied[tenant_id] = await store.put(
                tenant_id, policy, updated_by, expected_version=expected
            )
        except PolicyVersionConflict:
            continue  # another process seeded or an operator wrote it meanwhile
        if announce is not None:
            await announce(tenant_id)
    return applied


def _record(row: asyncpg.Record) -> PolicyRecord:
    return PolicyRecord(
        tenant_id=row["tenant_id"],
        policy=TenantPolicy.model_validate(row["document"]),
        version=int(row["version"]),
        updated_at=row["updated_at"],
        updated_by=row["updated_by"],
    )
