"""The first accepted request of an invocation id fixes what the id names (issue 32)."""

from __future__ import annotations

import dataclasses

import pytest

from toolfleet.policy.claims import CallIdentity, ClaimVerdict, MemoryInvocationClaims

pytestmark = pytest.mark.unit

ID = "7d9f3c2e-5b1a-4e8f-9c6d-2a4b8e1f0c3d"
FIRST = CallIdentity(
    tenant_id="t_b",
    agent_did="did:agent:b",
    tool_id="core__echo",
    requested_version="^1.0.0",
    parameters_hash="a" * 64,
)


async def test_the_first_request_fixes_the_id_and_a_resend_is_the_same_call() -> None:
    claims = MemoryInvocationClaims()
    assert await claims.claim(ID, FIRST) is ClaimVerdict.NEW
    assert await claims.claim(ID, dataclasses.replace(FIRST)) is ClaimVerdict.SAME
    assert await claims.claim(ID, FIRST) is ClaimVerdict.SAME


@pytest.mark.parametrize(
    "change",
    [
        {"tenant_id": "t_a"},
        {"agent_did": "did:agent:mallory"},
        {"tool_id": "core__shell"},
        {"requested_version": "*"},
        {"parameters_hash": "b" * 64},
    ],
)
async def test_any_other_field_is_a_conflict_that_changes_nothing(change: dict[str, str]) -> None:
    claims = MemoryInvocationClaims()
    await claims.claim(ID, FIRST)
    other = dataclasses.replace(FIRST, **change)
    assert await claims.claim(ID, other) is ClaimVerdict.CONFLICT
    assert await claims.claim(ID, other) is ClaimVerdict.CONFLICT  # still the first's
    assert await claims.claim(ID, FIRST) is ClaimVerdict.SAME


async def test_ids_are_independent() -> None:
    claims = MemoryInvocationClaims()
    other = dataclasses.replace(FIRST, tenant_id="t_a")
    assert await claims.claim(ID, FIRST) is ClaimVerdict.NEW
    assert await claims.claim("1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", other) is ClaimVerdict.NEW


async def test_text_moved_across_fields_is_another_identity() -> None:
    claims = MemoryInvocationClaims()
    first = dataclasses.replace(FIRST, agent_did='did:agent:b","core__echo')
    moved = dataclasses.replace(FIRST, agent_did="did:agent:b", tool_id='core__echo","core__echo')
    await claims.claim(ID, first)
    assert await claims.claim(ID, moved) is ClaimVerdict.CONFLICT
