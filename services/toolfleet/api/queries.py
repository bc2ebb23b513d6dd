"""Read-side SQL over the status projection (``tool_invocations``).

Lists use keyset pagination on ``(created_at, invocation_id)``, the order of the
``tool_invocations_tenant_created`` index, so a page costs the same wherever it is. The
cursor is opaque to clients: base64url of the last row's key.

A row is a call, ``(tenant_id, invocation_id)`` (migration 0011): two tenants may each
have a row under one id (a request that named another tenant's id gets a row of its
own, where its ``invocation_id_conflict`` refusal shows). Every read by id names the
caller's tenant; an admin (no tenant) reading by id gets the id's first call.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from toolfleet.contract.http import ApprovalView, InvocationPage, InvocationView
from toolfleet.events.models import InvocationStatus

_COLUMNS = """invocation_id, tenant_id, agent_did, tool_id, tool_version, status,
    progress_percent, current_phase, result, error, latest_checkpoint, execution_metadata,
    warnings, created_at, updated_at, started_at, completed_at, parameters, parameters_hash,
    trace_id, documents_accessed"""


class InvalidCursor(ValueError):
    """A ``cursor`` that this API did not hand out."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cursor:
    """Position after the last row of a page."""

    created_at: datetime
    invocation_id: UUID

    def encode(self) -> str:
        raw = json.dumps({"c": self.created_at.isoformat(), "i": str(self.invocation_id)})
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            fields = json.loads(raw)
            created_at = datetime.fromisoformat(fields["c"])
            invocation_id = UUID(fields["i"])
        except (binascii.Error, ValueError, TypeError, KeyError, UnicodeDecodeError):
            raise InvalidCursor("cursor is not one this API returned") from None
        if created_at.tzinfo is None:
            raise InvalidCursor("cursor is not one this API returned")
        return cls(created_at=created_at, invocation_id=invocation_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class InvocationFilter:
    """What ``GET /v1/invocations`` asks for."""

    tenant_id: str | None
    """Only this tenant's invocations; ``None`` means all tenants (admins)."""
    status: InvocationStatus | None = None
    tool_id: str | None = None
    agent_did: str | None = None
    created_from: datetime | None = None
    """Only calls created at or after this instant."""
    created_to: datetime | None = None
    """Only calls created before this instant."""
    id_range: tuple[UUID, UUID] | None = None
    """Only the calls whose id is in this closed range (the console's search by id or id
    prefix, see :func:`prefix_range`; a whole id is a range of one): a range on the key's
    second column, so it stays on the ``(tenant_id, invocation_id)`` key."""
    limit: int = 50
    after: Cursor | None = None


MIN_PREFIX_HEX = 8
"""Hex digits a search by id prefix needs (the short id the console shows)."""


def prefix_range(text: str) -> tuple[UUID, UUID]:
    """The ids that start with ``text`` (at least :data:`MIN_PREFIX_HEX` hex digits, with
    hyphens where a uuid has them), as ``(lowest, highest)``; ValueError otherwise."""
    lowered = text.strip().lower()
    digits = lowered.replace("-", "")
    if not (MIN_PREFIX_HEX <= len(digits) <= 32) or any(
        c not in "0123456789abcdef" for c in digits
    ):
        raise ValueError(f"an id prefix is {MIN_PREFIX_HEX} to 32 hex digits")
    low = UUID(digits.ljust(32, "0"))
    if not str(low).startswith(lowered):
        raise ValueError("an id prefix has its hyphens where a uuid has them")
    return low, UUID(digits.ljust(32, "f"))


class InvocationQueries:
    """Reads invocations; every read is scoped to a tenant unless the caller is admin."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    async def get(self, invocation_id: UUID, *, tenant_id: str | None) -> InvocationView | None:
        """The call ``(tenant_id, invocation_id)``, or ``None`` if that tenant has none.

        ``tenant_id=None`` (an admin): the id's first call, the row with the earliest
        ``created_at`` (a later tenant's row under the same id is its refused request;
        the list, which shows every row, finds it).
        """
        if tenant_id is None:
            row = await self._pool.fetchrow(
                f"""SELECT {_COLUMNS} FROM tool_invocations WHERE invocation_id = $1
                    ORDER BY created_at, tenant_id LIMIT 1""",  # noqa: S608 - placeholders only
                invocation_id,
            )
        else:
            row = await self._pool.fetchrow(
                f"""SELECT {_COLUMNS} FROM tool_invocations
                    WHERE tenant_id = $1 AND invocation_id = $2""",  # noqa: S608 - placeholders only
                tenant_id,
                invocation_id,
            )
        return None if row is None else _view(row)

    async def many(self, ids: Sequence[UUID]) -> list[InvocationView]:
        """The rows of ``ids`` that exist, every tenant's row of each (the console feed
        offers each row to the subscribers of its tenant only)."""
        rows = await self._pool.fetch(
            f"SELECT {_COLUMNS} FROM tool_invocations WHERE invocation_id = ANY($1::uuid[])",  # noqa: S608 - placeholders only
            list(ids),
        )
        return [_view(r) for r in rows]

    async def page(self, query: InvocationFilter) -> InvocationPage:
        """A page of invocations, newest first."""
        where: list[str] = ["TRUE"]
        args: list[Any] = []

        def arg(value: Any) -> str:
            args.append(value)
            return f"${len(args)}"

        conditions: list[tuple[str, Any]] = [
            ("tenant_id =", query.tenant_id),
            ("status =", query.status.value if query.status is not None else None),
            ("tool_id =", query.tool_id),
            ("agent_did =", query.agent_did),
            ("created_at >=", query.created_from),
            ("created_at <", query.created_to),
        ]
        where += [f"{test} {arg(value)}" for test, value in conditions if value is not None]
        if query.id_range is not None:
            low, high = query.id_range
            where.append(f"invocation_id BETWEEN {arg(low)} AND {arg(high)}")
        if query.after is not None:
            where.append(
                f"(created_at, invocation_id) < ({arg(query.after.created_at)}, "
                f"{arg(query.after.invocation_id)})"
            )
        # One row more than asked tells whether another page follows.
        limit = arg(query.limit + 1)
        rows = await self._pool.fetch(
            f"""SELECT {_COLUMNS} FROM tool_invocations WHERE {" AND ".join(where)}
                ORDER BY created_at DESC, invocation_id DESC LIMIT {limit}""",  # noqa: S608 - placeholders only
            *args,
        )
        items = [_view(r) for r in rows[: query.limit]]
        next_cursor = None
        if len(rows) > query.limit:
            last = items[-1]
            next_cursor = Cursor(
                created_at=last.created_at, invocation_id=last.invocation_id
            ).encode()
        return InvocationPage(items=items, next_cursor=next_cursor)


def _view(row: asyncpg.Record) -> InvocationView:
    """The API's view of a row: parameters only while an approver has to judge them."""
    fields = dict(row)
    parameters, digest = fields.pop("parameters"), fields.pop("parameters_hash")
    view = InvocationView.model_validate(fields)
    if view.status is not InvocationStatus.PENDING_APPROVAL:
        return view
    approval = ApprovalView(
        tool_id=view.tool_id,
        tool_version=view.tool_version,
        parameters=parameters,
        parameters_hash=digest,
    )
    return view.model_copy(update={"approval": approval})
