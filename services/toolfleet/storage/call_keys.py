"""How a call's Redis keys are named: ``<kind>:{<tenant_id>}:<invocation_id>[:<part>]``.

A call is ``(tenant_id, invocation_id)`` (:class:`~toolfleet.events.identity.CallKey`):
every key of a call's shared state names both, so two tenants that use the same
invocation id share no key. The tenant is in braces, a Redis Cluster hash tag, as in
the rate limit buckets (``ratelimit:{<tenant_id>}``) and idempotency claims
(``idempotency:{<tenant_id>}:<key>``): every key a script touches together (a lease,
its epoch, done mark, run count, cancel flag and hot checkpoint; an idempotency claim
with its owner's marker and outcome) is in the tenant's slot. A tenant id matches
``TENANT_ID_PATTERN`` (no braces), and the invocation id comes last, so the name of a
key reads back as exactly one (tenant, invocation) pair.

The names, with the contract's (section 5) in the unscoped form they extend:

- ``checkpoint:tool:{t}:<id>:latest`` (``checkpoint:tool:<id>:latest``), the hot checkpoint
- ``checkpoint:tool:{t}:<id>:documents``, the call's document version pins
- ``lease:tool:{t}:<id>`` and its ``:epoch``, ``:runs`` and ``:done``
- ``cancel:requested:{t}:<id>``
- ``approval:pending:{t}:<id>``, ``approval:expiring:{t}:<id>``
- ``idempotency:owner:{t}:<id>``, ``idempotency:outcome:{t}:<id>``,
  ``idempotency:waiters:{t}:<id>``
"""

from __future__ import annotations

from toolfleet.events.identity import CallKey

__all__ = ["call_key", "call_scope"]


def call_scope(call: CallKey) -> str:
    """``{<tenant_id>}:<invocation_id>``: the part of every key that names the call."""
    return f"{{{call.tenant_id}}}:{call.invocation_id}"


def call_key(kind: str, call: CallKey, part: str | None = None) -> str:
    """The key ``<kind>:{<tenant_id>}:<invocation_id>``, then ``:<part>`` if given."""
    key = f"{kind}:{call_scope(call)}"
    return key if part is None else f"{key}:{part}"
