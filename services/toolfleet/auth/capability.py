"""The verified claims of a capability token (:class:`Capability`), apart from the JWT
code that verifies them (:mod:`toolfleet.auth.tokens`).

The revocation list (:mod:`toolfleet.storage.revocation`) reads a capability's claims
but verifies no token; from here it does not load cryptography's RSA, about 7 MB of
resident memory in the executor, which holds one and verifies no token either
(issue 36: a worker stays within 80 MB). :mod:`toolfleet.auth.tokens` re-exports both.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

LEEWAY_S = 30
"""Clock skew tolerated on ``exp``, ``nbf`` and ``iat``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Capability:
    """The verified claims of a capability token, typed."""

    tenant_id: str
    """Tenant the token was issued for."""
    agent_did: str
    """Agent the token was issued to."""
    tool_id: str
    """Tool id or glob (``core__*``) the token grants."""
    tool_version: str
    """Version range the token grants (``*`` = any)."""
    jti: str
    """Unique token id (revocation is by ``jti``)."""
    subject: str
    """``sub`` (the agent DID unless the issuer said otherwise)."""
    scopes: frozenset[str]
    """Space-separated ``scope`` claim (``admin`` lets the API see every tenant)."""
    allowed_operations: tuple[str, ...] = ("invoke",)
    """What the agent may do with the tool (``invoke`` ...)."""
    filesystem_permissions: tuple[str, ...] = ()
    network_permissions: tuple[str, ...] = ()
    credential_permissions: tuple[str, ...] = ()
    connections: tuple[str, ...] = ()
    """Connection ids whose secrets the token grants (``connection_id`` of a request)."""
    issuer: str = ""
    """``iss``."""
    audience: str = ""
    """The ``aud`` value this verifier accepted."""
    issued_at: int = 0
    """``iat``, epoch seconds."""
    expires_at: int = 0
    """``exp``, epoch seconds."""
    claims: dict[str, Any] = field(default_factory=dict, repr=False)
    """Every claim, for the rare consumer that needs an extension claim."""

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes

    def allows_tool(self, tool_id: str) -> bool:
        return fnmatch.fnmatchcase(tool_id, self.tool_id)

    def allows_operation(self, operation: str) -> bool:
        return operation in self.allowed_operations

    def allows_connection(self, connection_id: str) -> bool:
        return connection_id in self.connections
