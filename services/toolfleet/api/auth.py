"""Bearer-token authentication: every route but health names a caller.

The bearer token is a capability token signed by the fleet's keys; its ``tenant_id``
claim scopes what the caller sees. The token itself never appears in a response or a
log line: a failure says which check failed, nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from toolfleet.api.problems import ProblemError
from toolfleet.api.resources import ApiResources, resources
from toolfleet.auth.tokens import Capability
from toolfleet.errors import ErrorCode, PermissionDenied

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

    @property
    def tenant_scope(self) -> str | None:
        """The tenant to filter reads by, or ``None`` for an admin (all tenants)."""
        return None if self.is_admin else self.tenant_id


def _unauthorized(detail: str, *, invalid: bool) -> ProblemError:
    challenge = 'Bearer error="invalid_token"' if invalid else "Bearer"
    return ProblemError(
        401, detail, code=ErrorCode.PERMISSION_DENIED, headers={"WWW-Authenticate": challenge}
    )


async def authenticate(
    res: Annotated[ApiResources, Depends(resources)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    """FastAPI dependency: the verified caller, or a 401 problem."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise _unauthorized("a bearer token is required", invalid=False)
    try:
        capability = await res.verifier.verify_fresh(credentials.credentials)
    except PermissionDenied as exc:
        raise _unauthorized(exc.message, invalid=True) from None
    return Caller(capability=capability, token=credentials.credentials)


CallerDep = Annotated[Caller, Depends(authenticate)]
"""Route parameter type of an authenticated caller."""
