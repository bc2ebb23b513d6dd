"""What policy remembers between requests answers exactly as computing it anew would."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import jwt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolfleet.auth.jws import HS256Signer
from toolfleet.contract.manifest import LifecycleState, ToolManifest
from toolfleet.errors import InvalidEvent, PermissionDenied, ToolRemoved
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import CallKey
from toolfleet.events.models import Effect
from toolfleet.events.types import EventType
from toolfleet.policy.documents import AgentPolicy, Budgets, TenantPolicy
from toolfleet.policy.engine import (
    DecisionCache,
    PolicyDecision,
    PolicyQuery,
    decide_tenant,
    pinned_versions,
)
from toolfleet.policy.idempotency import Waiter
from toolfleet.policy.memory_stores import MemoryIdempotencyStore
from toolfleet.policy.schemas import ManifestSchemas
from toolfleet.policy.service import PolicyService
from toolfleet.registry.lookup import MemoryManifests, ToolLookup
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.storage.revocation import CachedRevocationList, MemoryRevocationList

pytestmark = pytest.mark.unit

POLICY = TenantPolicy(
    allow_tools=["core__*", "acme__*"],
    deny_tools=["acme__drop"],
    tool_versions={"core__echo": "1.0.0"},
    approval_effects=[Effect.EXTERNAL_SIDE_EFFECT],
    agents={"did:agent:narrow": AgentPolicy(allow_tools=["core__echo"])},
    budgets=Budgets(max_calls_per_minute=60),
    tool_budgets={"core__*": Budgets(max_runtime_ms=5000)},
)


def _query(
    tool_id: str, *, agent: str = "did:agent:a", effect: Effect = Effect.READ_ONLY
) -> PolicyQuery:
    return PolicyQuery(
        tenant_id="t_acme",
        agent_did=agent,
        tool_id=tool_id,
        version="1.0.0",
        effect=effect,
        approval_requested=False,
    )


def _outcome(
    policy: TenantPolicy | None,
    query: PolicyQuery,
    decide: Callable[[TenantPolicy | None, PolicyQuery], PolicyDecision],
) -> PolicyDecision | tuple[str, str]:
    try:
        return decide(policy, query)
    except PermissionDenied as exc:
        return ("denied", exc.message)


QUERIES = [
    _query("core__echo"),
    _query("acme__send", effect=Effect.EXTERNAL_SIDE_EFFECT),
    _query("acme__drop"),
    _query("other__x"),
    _query("acme__send", agent="did:agent:narrow"),
]


def test_remembered_decisions_are_the_engines_and_refusals_are_raised_anew() -> None:
    cache = DecisionCache()
    for _ in range(2):  # computed, then remembered
        for query in QUERIES:
            assert _outcome(POLICY, query, cache.decide) == _outcome(POLICY, query, decide_tenant)
    errors = []
    for _ in range(2):
        with pytest.raises(PermissionDenied) as caught:
            cache.decide(POLICY, _query("acme__drop"))
        errors.append(caught.value)
    assert errors[0] is not errors[1]
    assert cache.pinned(POLICY, "core__echo") == pinned_versions(POLICY, "core__echo")
    assert cache.pinned(None, "core__echo") == frozenset()
    with pytest.raises(PermissionDenied, match="no policy allows"):
        cache.decide(None, _query("core__echo"))


def test_a_changed_policy_is_decided_anew() -> None:
    cache = DecisionCache()
    assert cache.decide(POLICY, _query("acme__send")).budgets.max_calls_per_minute == 60
    changed = POLICY.model_copy(update={"deny_tools": ["acme__*"]})
    with pytest.raises(PermissionDenied):
        cache.decide(changed, _query("acme__send"))
    assert cache.decide(POLICY, _query("core__echo")).budgets.max_runtime_ms == 5000


def _manifest(version: str, **dates: datetime | None) -> ToolManifest:
    return ToolManifest(
        tool_id="acme__old",
        version=version,
        effect=Effect.READ_ONLY,
        input_schema={"type": "object"},
        output_schema={"type": "object"},
        redaction_allowlist=[],
        timeout_seconds=10,
        lifecycle_state=LifecycleState.DEPRECATED if dates else LifecycleState.ACTIVE,
        **dates,
    )


class DateClock:
    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now


async def test_a_remembered_resolution_ends_at_the_next_lifecycle_date() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    clock = DateClock(start)
    deprecated = _manifest(
        "1.0.0",
        deprecation_date=start + timedelta(days=1),
        sunset_date=start + timedelta(days=2),
    )
    lookup = ToolLookup(MemoryManifests([deprecated]), ttl_s=3600, clock=clock)

    first = await lookup.resolve("acme__old", "^1.0")
    assert (first.manifest.version, first.warnings) == ("1.0.0", [])
    first.warnings.append("a caller's own edit")  # never leaks into the next answer
    assert (await lookup.resolve("acme__old", "^1.0")).warnings == []

    clock.now = start + timedelta(days=1)  # deprecated from now on: a warning
    warned = await lookup.resolve("acme__old", "^1.0")
    assert len(warned.warnings) == 1
    assert "deprecated" in warned.warnings[0]

    clock.now = start + timedelta(days=2)  # sunset: only a pin lets it run
    with pytest.raises(ToolRemoved):
        await lookup.resolve("acme__old", "^1.0")
    pinned = await lookup.resolve("acme__old", "^1.0", pinned=frozenset({"1.0.0"}))
    assert "sunset" in pinned.warnings[0]


async def test_a_refreshed_version_list_resolves_anew() -> None:
    manifests = MemoryManifests([_manifest("1.0.0")])
    lookup = ToolLookup(manifests, ttl_s=0.0)  # every call reads the source
    assert (await lookup.resolve("acme__old", "^1.0")).manifest.version == "1.0.0"
    manifests.register(_manifest("1.1.0"))
    assert (await lookup.resolve("acme__old", "^1.0")).manifest.version == "1.1.0"


REGISTERED = {"iss", "sub", "aud", "exp", "nbf", "iat", "jti"}
"""JWT's registered claims: PyJWT (2.10 and later) refuses to encode one of the wrong type."""


@given(
    claims=st.dictionaries(
        st.text(min_size=1, max_size=12).filter(lambda name: name not in REGISTERED),
        st.one_of(st.integers(), st.text(max_size=20), st.lists(st.text(max_size=8), max_size=3)),
        max_size=6,
    ),
    registered=st.fixed_dictionaries(
        {},
        optional={
            "iss": st.text(max_size=20),
            "sub": st.text(max_size=20),
            "jti": st.text(max_size=20),
            "aud": st.one_of(st.text(max_size=8), st.lists(st.text(max_size=8), max_size=3)),
            "exp": st.integers(0, 2**40),
            "nbf": st.integers(0, 2**40),
            "iat": st.integers(0, 2**40),
        },
    ),
    kid=st.text(min_size=1, max_size=16),
)
def test_hs256_signer_writes_what_pyjwt_writes(
    claims: dict[str, object], registered: dict[str, object], kid: str
) -> None:
    key = b"k" * 32
    headers = {"kid": kid, "typ": "toolfleet-grant+jwt"}
    claims = {**claims, **registered}
    assert HS256Signer(key, headers).sign(claims) == jwt.encode(
        claims, key, algorithm="HS256", headers=headers
    )


async def test_concurrent_checks_of_one_jti_share_one_read() -> None:
    gate = asyncio.Event()

    class SlowSource(MemoryRevocationList):
        reads = 0

        async def is_revoked(self, jti: str) -> bool:
            SlowSource.reads += 1
            await gate.wait()
            return await super().is_revoked(jti)

    revocations = CachedRevocationList(SlowSource(), ttl_s=10)
    revocations.after_subscribe()
    checks = [asyncio.create_task(revocations.is_revoked("j1")) for _ in range(5)]
    await asyncio.sleep(0)
    gate.set()
    assert await asyncio.gather(*checks) == [False] * 5
    assert SlowSource.reads == 1


async def test_a_check_after_an_invalidation_does_not_wait_for_an_older_read() -> None:
    gate = asyncio.Event()
    source = MemoryRevocationList()

    class SlowSource(MemoryRevocationList):
        async def is_revoked(self, jti: str) -> bool:
            answer = await source.is_revoked(jti)
            await gate.wait()
            return answer

    revocations = CachedRevocationList(SlowSource(), ttl_s=10)
    revocations.after_subscribe()
    old = asyncio.create_task(revocations.is_revoked("j1"))
    await asyncio.sleep(0)
    await source.revoke("j1", ttl_s=60)
    await revocations.invalidate("j1")
    new = asyncio.create_task(revocations.is_revoked("j1"))
    await asyncio.sleep(0)
    gate.set()
    assert (await old, await new) == (False, True)
    assert await revocations.is_revoked("j1")


async def test_a_cancelled_read_leaves_the_checks_waiting_on_it_to_read_again() -> None:
    gate = asyncio.Event()

    class SlowSource(MemoryRevocationList):
        async def is_revoked(self, jti: str) -> bool:
            await gate.wait()
            return False

    revocations = CachedRevocationList(SlowSource(), ttl_s=10)
    revocations.after_subscribe()
    first = asyncio.create_task(revocations.is_revoked("j1"))
    await asyncio.sleep(0)
    second = asyncio.create_task(revocations.is_revoked("j1"))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    gate.set()
    assert await second is False
    assert first.cancelled()


async def test_only_owners_and_their_waiters_need_an_outcome() -> None:
    store = MemoryIdempotencyStore()
    owner, stranger, duplicate = (
        CallKey(tenant_id="t", invocation_id=str(uuid.uuid4())) for _ in range(3)
    )
    await store.claim("t", "k", owner.invocation_id, "h")
    # The same invocation id in another tenant is another call: it owns nothing.
    elsewhere = CallKey(tenant_id="t2", invocation_id=owner.invocation_id)
    assert await store.owns_keys([owner, stranger, elsewhere]) == [True, False, False]
    assert await store.add_waiter(owner, duplicate.invocation_id, "{}") is None
    assert await store.owns_keys([duplicate, owner]) == [False, True]


class CountingIdempotency(MemoryIdempotencyStore):
    finished: int = 0

    async def finish(self, call: CallKey, outcome_json: str) -> list[Waiter]:
        CountingIdempotency.finished += 1
        return await super().finish(call, outcome_json)


async def test_outcomes_of_calls_owning_no_key_are_passed_over_undecoded() -> None:
    idempotency = CountingIdempotency()
    unused = cast(Any, None)  # on_results reads nothing else
    service = PolicyService(
        lookup=unused,
        verifier=None,
        policies=unused,
        schemas=unused,
        approvals=unused,
        cancels=unused,
        limiter=unused,
        idempotency=idempotency,
    )
    stranger = str(uuid.uuid4())
    # Not even valid as an outcome: nobody needs it, so it is not validated.
    event = Envelope(
        id="e1",
        source="validator",
        type=EventType.SUCCEEDED,
        invocationid=stranger,
        data={"invocation_id": stranger, "tenant_id": "t_acme", "status": "not-a-status"},
    )
    assert await service.on_results([event, event]) == []
    assert CountingIdempotency.finished == 0
    owner = str(uuid.uuid4())
    await idempotency.claim("t_acme", "k", owner, "h")
    owned = event.model_copy(
        update={
            "invocationid": owner,
            "data": {"invocation_id": owner, "tenant_id": "t_acme", "status": "bad"},
        }
    )
    with pytest.raises(InvalidEvent):  # an owner's outcome is validated, as before
        await service.on_results([event, owned])


def test_manifest_schemas_answer_as_compiled_schemas() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    remembered, compiled = ManifestSchemas(), CompiledSchemas()
    for instance in ({"n": 1}, {"n": "x"}, {}, {"n": 2}):
        assert remembered.errors(schema, instance) == compiled.errors(schema, instance)
    assert remembered.validator(schema) is remembered.validator(schema)
    reloaded = json.loads(json.dumps(schema))  # a reloaded manifest: a new, equal dict
    assert remembered.validator(reloaded) is remembered.validator(schema)
    changed = {**schema, "required": []}
    assert remembered.errors(changed, {}) == []
