"""Bearer-token authentication: every route but health names a caller.

The bearer token is a capability token signed by the fleet's keys; its ``tenant_id``
claim scopes what the caller sees. Every request checks the token's ``jti`` against the
revocation list (a revoked token is a ``401``; an unreachable list a ``503``: never let a
possibly revoked token through). The token itself never appears in a response or a log
line: a failure says which check failed, nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis.exceptions import RedisError

from toolfleet.api.problems import ProblemError
from toolfleet.api.resources import ApiResources, resources
from toolfleet.auth.tokens import Capability
from toolfleet.errors import ErrorCode, PermissionDenied
from toolfleet.storage.revocation import ensure_not_revoked

_bearer = HTTPBearer(auto_error=False, description="A capability token (RS256 JWT).")


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """Who is calling: the verified claims, and the raw token to forward as a capability."""

    capability: Capability
    token: str = field(repr=False)

    @property
    def tenant_id(self) -> str:
        return self.capability.tenant_id

    @property
    def is_admin(self) -> bool:
        return self.capability.is_admin

    @property
    def subject(self) -> str:
        return self.capability.subject

    def may_see(self, tenant_id: str) -> bool:
        """Whether this caller may read or act on ``tenant_id``'s invocations."""
        return self.is_admin or tenant_id == self.tenant_id

    def may_decide(self, tenant_id: str) -> bool:
        """Whether this caller may approve or deny ``tenant_id``'s pending calls.

        Needs the ``approver`` scope for that tenant, or ``admin``; a plain capability
        token (what agents hold) never decides.
        """
        return self.is_admin or (
            "approver" in self.capability.scopes and tenant_id == self.tenant_id
        )

    def is_requester(self, agent_did: str | None) -> bool:
        """Whether this caller is the agent that requested a call (unknown counts as yes)."""
        return agent_did is None or agent_did in {self.subject, self.capability.agent_did}

    @property
    def tenant_scope(self) -> str | None:
        """The tenant to filter reads by, or ``None`` for an admin (all tenants)."""
        return None if self.is_admin else self.tenant_id


def _unauthorized(detail: str, *, invalid: bool) -> ProblemError:
    challenge = 'Bearer error="invalid_token"' if invalid else "Bearer"
    return ProblemError(
        401, detail, code=ErrorCode.PERMISSION_DENIED, headers={"WWW-Authenticate": challenge}
    )


async def verify_bearer(res: ApiResources, authorization: str | None) -> Caller:
    """The verified, unrevoked caller of an ``Authorization`` header value.

    Every door of the API (the HTTP routes, ``/mcp``) calls this, so token checks and
    revocation hold the same everywhere.

    Raises:
        ProblemError: ``401`` without a bearer token or with a bad or revoked one;
            ``503`` when the revocation list cannot be read.
    """
    scheme, _, token = (authorization or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise _unauthorized("a bearer token is required", invalid=False)
    try:
        capability = await res.verifier.verify_fresh(token)
    except PermissionDenied as exc:
        raise _unauthorized(exc.message, invalid=True) from None
    try:
        await ensure_not_revoked(res.revocations, capability)
    except PermissionDenied as exc:
        raise _unauthorized(exc.message, invalid=True) from None
    except (RedisError, OSError):
        raise ProblemError(
            503,
            "the revocation list is unavailable; retry later",
            code=ErrorCode.INTERNAL_ERROR,
            headers={"Retry-After": "1"},
        ) from None
    return Caller(capability=capability, token=token)


async def authenticate(
    res: Annotated[ApiResources, Depends(resources)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    """FastAPI dependency: the verified, unrevoked caller; else a 401 (or 503) problem."""
    if credentials is None:
        raise _unauthorized("a bearer token is required", invalid=False)
    return await verify_bearer(res, f"{credentials.scheme} {credentials.credentials}")


CallerDep = Annotated[Caller, Depends(authenticate)]
"""Route parameter type of an authenticated caller."""
