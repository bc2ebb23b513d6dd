"""Issue 32, identity: every Redis key of a call names its tenant and its invocation.

Two tenants that use the same invocation id share no key, and every key of one call
is in its tenant's Redis Cluster slot (the hash tag), so the scripts that touch a
call's keys together stay single-slot.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolfleet.documents.pins import pins_key
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import CallKey, CallRef
from toolfleet.events.models import TENANT_ID_PATTERN
from toolfleet.executor.leasing.fencing import checkpoint_key, epoch_key, lease_key, runs_key
from toolfleet.executor.leasing.leases import done_key
from toolfleet.policy.redis_stores import RedisIdempotencyStore
from toolfleet.storage.call_keys import call_key, call_scope
from toolfleet.storage.cancel_flags import cancel_key

pytestmark = pytest.mark.unit

#: Every key builder of a call's shared state.
BUILDERS: dict[str, Callable[[CallKey], str]] = {
    "checkpoint": checkpoint_key,
    "pins": pins_key,
    "lease": lease_key,
    "epoch": epoch_key,
    "runs": runs_key,
    "done": done_key,
    "cancel": cancel_key,
}

tenants = st.from_regex(TENANT_ID_PATTERN, fullmatch=True)
invocations = st.uuids().map(str)


def hash_tag(key: str) -> str:
    """What Redis Cluster hashes: the text between the first ``{`` and the next ``}``
    when it is not empty, else the whole key (the cluster specification's rule)."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def test_the_contract_names_gain_the_tenant_as_a_hash_tag() -> None:
    call = CallKey(tenant_id="t_acme", invocation_id="6a1f3c1e-0000-4000-8000-000000000001")
    scope = "{t_acme}:6a1f3c1e-0000-4000-8000-000000000001"
    assert checkpoint_key(call) == f"checkpoint:tool:{scope}:latest"
    assert pins_key(call) == f"checkpoint:tool:{scope}:documents"
    assert lease_key(call) == f"lease:tool:{scope}"
    assert epoch_key(call) == f"lease:tool:{scope}:epoch"
    assert runs_key(call) == f"lease:tool:{scope}:runs"
    assert done_key(call) == f"lease:tool:{scope}:done"
    assert cancel_key(call) == f"cancel:requested:{scope}"


@given(first=tenants, other=tenants, invocation_id=invocations)
def test_two_tenants_with_one_invocation_id_share_no_key(
    first: str, other: str, invocation_id: str
) -> None:
    if first == other:
        return
    mine = CallKey(tenant_id=first, invocation_id=invocation_id)
    theirs = CallKey(tenant_id=other, invocation_id=invocation_id)
    keys_of_mine = {build(mine) for build in BUILDERS.values()}
    keys_of_theirs = {build(theirs) for build in BUILDERS.values()}
    assert len(keys_of_mine) == len(BUILDERS)  # and no two builders collide
    assert keys_of_mine.isdisjoint(keys_of_theirs)


@given(calls=st.lists(st.tuples(tenants, invocations), min_size=2, max_size=6, unique=True))
def test_a_key_names_exactly_one_call(calls: list[tuple[str, str]]) -> None:
    """Injective, however the tenant's text and the id's could be shuffled around."""
    scoped = {call_key("k", CallKey(tenant_id=t, invocation_id=i)) for t, i in calls}
    assert len(scoped) == len(calls)


@given(tenant=tenants, invocation_id=invocations)
def test_every_key_of_a_call_is_in_its_tenants_slot(tenant: str, invocation_id: str) -> None:
    call = CallKey(tenant_id=tenant, invocation_id=invocation_id)
    assert {hash_tag(build(call)) for build in BUILDERS.values()} == {tenant}


def test_the_policy_stores_keys_are_scoped_the_same_way() -> None:
    invocation_id = str(uuid.uuid4())
    a = CallKey(tenant_id="tenant-a", invocation_id=invocation_id)
    b = CallKey(tenant_id="tenant-b", invocation_id=invocation_id)
    store = RedisIdempotencyStore(redis=None, prefix="")  # type: ignore[arg-type]
    keys, args = store.script_input("tenant-a", "idem-1", invocation_id, "h", 60)
    # The claim script's keys, and the outcome key it builds, are all in A's slot.
    assert [hash_tag(k) for k in keys] == ["tenant-a", "tenant-a"]
    assert hash_tag(f"{args[3]}{invocation_id}") == "tenant-a"
    assert keys[1] == f"idempotency:owner:{call_scope(a)}"
    assert keys[1] != f"idempotency:owner:{call_scope(b)}"
    assert str(args[3]) == "idempotency:outcome:{tenant-a}:"


def test_a_call_ref_names_its_key() -> None:
    ref = CallRef(invocation_id="i1", tenant_id="t1", agent_did="did:agent:a", tool_id="x")
    assert ref.key == CallKey(tenant_id="t1", invocation_id="i1")


def test_another_tenants_event_with_the_same_source_and_id_is_not_a_duplicate() -> None:
    """Dedupe by ``source`` + ``id`` alone let tenant A send first the event id tenant B
    would use (``job-1``), and B's request was then dropped as a duplicate of A's."""
    mine, theirs = (
        Envelope(id="job-1", source="/client", type="t", tenantid=tenant) for tenant in "ab"
    )
    assert mine.dedupe_key != theirs.dedupe_key
    assert mine.dedupe_key == mine.model_copy().dedupe_key  # a redelivery is one
