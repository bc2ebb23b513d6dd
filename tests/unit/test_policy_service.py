"""``PolicyService`` on in-memory twins: what a request gets, decided by policy alone."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel

from toolfleet.auth.control import ControlSigner, ControlVerifier, control_claims
from toolfleet.auth.grants import GrantSigner, GrantVerifier
from toolfleet.auth.keys import generate_key_pair
from toolfleet.auth.outcomes import OutcomeSigner, OutcomeVerifier
from toolfleet.auth.tokens import TokenIssuer, TokenVerifier
from toolfleet.contract.manifest import ToolManifest
from toolfleet.errors import ErrorCode
from toolfleet.events.envelope import Emitted, Envelope, new_event
from toolfleet.events.identity import CallKey, CallRef
from toolfleet.events.models import (
    AgentContext,
    ApprovalDecision,
    ApprovalRequested,
    Effect,
    ExecutionOptions,
    InvocationStatus,
    InvokeAuthorized,
    InvokeRequested,
    ToolOutcome,
)
from toolfleet.events.outcomes import outcome_event
from toolfleet.events.types import EventType, Source, TopicName
from toolfleet.policy.documents import Budgets, TenantPolicy
from toolfleet.policy.memory_stores import (
    MemoryApprovalStore,
    MemoryIdempotencyStore,
    StaticPolicies,
)
from toolfleet.policy.ratelimit import MemoryRateLimiter
from toolfleet.policy.service import PolicyService
from toolfleet.registry.lookup import MemoryManifests, ToolLookup
from toolfleet.registry.schemas import CompiledSchemas
from toolfleet.sdk import ToolContext, spec_of, tool
from toolfleet.storage.cancel_flags import MemoryCancelFlags
from toolfleet.storage.revocation import MemoryRevocationList

pytestmark = pytest.mark.unit

TENANT = "t_acme"
AGENT = "did:agent:a"
CONTROL_KEY = b"c" * 32
PAIR = generate_key_pair()
ISSUER = TokenIssuer(PAIR.private_pem, issuer="iss", audience="aud")


def _manifest(tool_id: str, effect: Effect) -> ToolManifest:
    return ToolManifest(
        tool_id=tool_id,
        version="1.0.0",
        effect=effect,
        input_schema={
            "type": "object",
            "properties": {"message": {"type": "string"}},
            "required": ["message"],
        },
        output_schema={"type": "object"},
        redaction_allowlist=[],
        timeout_seconds=10,
    )


ECHO = _manifest("core__echo", Effect.READ_ONLY)
SEND = _manifest("acme__send", Effect.EXTERNAL_SIDE_EFFECT)
DROP = _manifest("acme__drop", Effect.READ_ONLY)

POLICY = TenantPolicy(
    allow_tools=["core__*", "acme__*"],
    deny_tools=["acme__drop"],
    approval_effects=[Effect.EXTERNAL_SIDE_EFFECT],
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Fleet:
    """The service and the twins a test reads back."""

    clock: Clock = field(default_factory=Clock)
    approvals: MemoryApprovalStore = field(default_factory=MemoryApprovalStore)
    cancels: MemoryCancelFlags = field(default_factory=MemoryCancelFlags)
    revocations: MemoryRevocationList = field(default_factory=MemoryRevocationList)
    policies: StaticPolicies = field(default_factory=lambda: StaticPolicies({TENANT: POLICY}))
    manifests: list[ToolManifest] = field(default_factory=lambda: [ECHO, SEND, DROP])

    def __post_init__(self) -> None:
        self.service = PolicyService(
            lookup=ToolLookup(MemoryManifests(self.manifests)),
            verifier=TokenVerifier([PAIR.public_pem], issuer="iss", audience="aud"),
            policies=self.policies,
            schemas=CompiledSchemas(),
            approvals=self.approvals,
            cancels=self.cancels,
            limiter=MemoryRateLimiter(clock=self.clock),
            idempotency=MemoryIdempotencyStore(),
            revocations=self.revocations,
            control=ControlVerifier([CONTROL_KEY]),
            outcomes=OutcomeVerifier([CONTROL_KEY]),
        )


@pytest.fixture
def fleet() -> Fleet:
    return Fleet()


def _request(
    tool_id: str = "core__echo",
    *,
    token: str | None = None,
    parameters: dict[str, Any] | None = None,
    idempotency_key: str | None = None,
) -> Envelope:
    data = InvokeRequested(
        invocation_id=uuid.uuid4(),
        tool_id=tool_id,
        agent_context=AgentContext(agent_did=AGENT, tenant_id=TENANT),
        parameters={"message": "hi"} if parameters is None else parameters,
        capability_token=token or ISSUER.issue(tenant_id=TENANT, agent_did=AGENT),
        execution_options=ExecutionOptions(idempotency_key=idempotency_key),
    )
    return new_event(
        event_type=EventType.INVOKE_REQUESTED,
        source=Source.CLIENT,
        data=data,
        tenant_id=TENANT,
        invocation_id=str(data.invocation_id),
        traceparent="00-" + "ab" * 16 + "-" + "cd" * 8 + "-01",
    )


async def _ask(fleet: Fleet, event: Envelope) -> list[Emitted]:
    return await fleet.service.on_requested(event, TENANT.encode())


def _one(emitted: list[Emitted]) -> tuple[TopicName, Envelope]:
    assert len(emitted) == 1
    return emitted[0]


def _error(emitted: list[Emitted]) -> ErrorCode:
    topic, event = _one(emitted)
    assert topic == TopicName.RESULTS
    outcome = event.data_as(ToolOutcome)
    assert outcome.error is not None
    return outcome.error.code


def _decision(fleet: Fleet, invocation_id: str, *, grant: bool) -> Envelope:
    event_type = EventType.APPROVAL_GRANTED if grant else EventType.APPROVAL_DENIED
    pending = fleet.approvals.pending[CallKey(tenant_id=TENANT, invocation_id=invocation_id)]
    data = ApprovalDecision(
        invocation_id=uuid.UUID(invocation_id),
        tenant_id=TENANT,
        approver="did:user:alice",
        parameters_hash=pending.parameters_hash,
    )
    signature = ControlSigner(CONTROL_KEY).sign(control_claims(event_type, data))
    return new_event(
        event_type=event_type,
        source=Source.API,
        data=data.model_copy(update={"signature": signature}),
        tenant_id=TENANT,
        invocation_id=invocation_id,
    )


async def test_an_allowed_call_is_authorized_without_its_token(fleet: Fleet) -> None:
    request = _request()
    topic, event = _one(await _ask(fleet, request))
    assert topic == TopicName.AUTHORIZED
    authorized = event.data_as(InvokeAuthorized)
    assert (authorized.tool_id, authorized.tool_version) == ("core__echo", "1.0.0")
    assert "capability_token" not in event.data
    assert (event.authtype, event.authid) == ("app_user", AGENT)
    assert event.traceparent == request.traceparent


async def test_a_denied_tool_fails_with_permission_denied(fleet: Fleet) -> None:
    assert _error(await _ask(fleet, _request("acme__drop"))) == ErrorCode.PERMISSION_DENIED


async def test_a_tenant_without_policy_may_call_nothing(fleet: Fleet) -> None:
    fleet.policies.policies.clear()
    assert _error(await _ask(fleet, _request())) == ErrorCode.PERMISSION_DENIED


async def test_parameters_outside_the_schema_are_refused(fleet: Fleet) -> None:
    emitted = await _ask(fleet, _request(parameters={"message": 3}))
    assert _error(emitted) == ErrorCode.INVALID_PARAMETERS


async def test_a_revoked_token_is_refused(fleet: Fleet) -> None:
    issued = ISSUER.mint(tenant_id=TENANT, agent_did=AGENT)
    await fleet.revocations.revoke(issued.jti, ttl_s=3600)
    emitted = await _ask(fleet, _request(token=issued.token))
    assert _error(emitted) == ErrorCode.PERMISSION_DENIED


async def test_a_token_of_another_tenant_is_refused(fleet: Fleet) -> None:
    token = ISSUER.issue(tenant_id="t_other", agent_did=AGENT)
    assert _error(await _ask(fleet, _request(token=token))) == ErrorCode.PERMISSION_DENIED


async def test_a_side_effect_is_parked_until_an_approver_grants_it(fleet: Fleet) -> None:
    request = _request("acme__send")
    topic, event = _one(await _ask(fleet, request))
    assert (topic, event.type) == (TopicName.EVENTS, EventType.APPROVAL_REQUESTED)
    invocation_id = str(event.data_as(ApprovalRequested).invocation_id)
    assert _key(invocation_id) in fleet.approvals.pending

    topic, authorized = _one(
        await fleet.service.on_control(_decision(fleet, invocation_id, grant=True), None)
    )
    assert topic == TopicName.AUTHORIZED
    assert authorized.data_as(InvokeAuthorized).tool_id == "acme__send"
    assert authorized.traceparent == request.traceparent  # the request's trace, not the API's
    assert fleet.approvals.pending == {}


class _Message(BaseModel):
    message: str


@tool(
    id="acme__wire",
    version="1.0.0",
    effect="read_only",
    redaction_allowlist=["message"],
    requires_approval=True,
)
async def _wire(params: _Message, ctx: ToolContext) -> _Message:
    return params


async def test_a_tool_declared_to_require_approval_is_parked_whatever_its_effect() -> None:
    fleet = Fleet(manifests=[spec_of(_wire).manifest()])  # POLICY parks side effects only
    topic, event = _one(await _ask(fleet, _request("acme__wire")))
    assert (topic, event.type) == (TopicName.EVENTS, EventType.APPROVAL_REQUESTED)
    assert _key(str(event.data_as(ApprovalRequested).invocation_id)) in fleet.approvals.pending


async def test_a_denied_approval_ends_the_call(fleet: Fleet) -> None:
    _, event = _one(await _ask(fleet, _request("acme__send")))
    invocation_id = str(event.data_as(ApprovalRequested).invocation_id)
    emitted = await fleet.service.on_control(_decision(fleet, invocation_id, grant=False), None)
    assert _error(emitted) == ErrorCode.APPROVAL_DENIED
    assert event.data_as(ApprovalRequested).invocation_id == uuid.UUID(invocation_id)


async def test_an_approval_after_the_token_was_revoked_runs_nothing(fleet: Fleet) -> None:
    issued = ISSUER.mint(tenant_id=TENANT, agent_did=AGENT)
    _, event = _one(await _ask(fleet, _request("acme__send", token=issued.token)))
    invocation_id = str(event.data_as(ApprovalRequested).invocation_id)
    await fleet.revocations.revoke(issued.jti, ttl_s=3600)
    emitted = await fleet.service.on_control(_decision(fleet, invocation_id, grant=True), None)
    assert _error(emitted) == ErrorCode.PERMISSION_DENIED


async def test_an_approved_call_gets_the_same_file_and_network_grant_as_a_direct_one() -> None:
    fleet = Fleet()
    key = b"g" * 32
    fleet.service.grants = GrantSigner(key)
    token = ISSUER.issue(
        tenant_id=TENANT,
        agent_did=AGENT,
        filesystem_permissions=["/srv/data", "rw:/srv/out"],
        network_permissions=["api.example.com"],
    )
    _, parked = _one(await _ask(fleet, _request("acme__send", token=token)))
    invocation_id = str(parked.data_as(ApprovalRequested).invocation_id)
    _, approved = _one(
        await fleet.service.on_control(_decision(fleet, invocation_id, grant=True), None)
    )
    _, direct = _one(await _ask(fleet, _request("core__echo", token=token)))

    def granted(event: Envelope) -> tuple[tuple[str, ...], tuple[str, ...]]:
        call = event.data_as(InvokeAuthorized)
        assert call.grant is not None
        claims = GrantVerifier([key]).decode(
            call.grant, call=CallRef.of(call), parameters=call.parameters
        )
        return claims.filesystem_permissions, claims.network_permissions

    expected = (("/srv/data", "rw:/srv/out"), ("api.example.com",))
    assert granted(approved) == granted(direct) == expected


async def test_a_duplicate_key_answers_with_the_first_calls_outcome(fleet: Fleet) -> None:
    first = _request(idempotency_key="order-7")
    topic, _ = _one(await _ask(fleet, first))
    assert topic == TopicName.AUTHORIZED
    second = _request(idempotency_key="order-7")
    assert await _ask(fleet, second) == []  # waits for the first call's outcome

    first_id = uuid.UUID(first.invocationid or "")
    finished = ToolOutcome(
        invocation_id=first_id,
        status=InvocationStatus.SUCCESS,
        agent_did=AGENT,
        tenant_id=TENANT,
        tool_id="core__echo",
        tool_version="1.0.0",
        result={"message": "hi", "length": 2},
    )
    topic, answer = _one(
        await fleet.service.on_results(
            [OutcomeSigner(CONTROL_KEY).seal(outcome_event(first, Source.VALIDATOR, finished))]
        )
    )
    assert topic == TopicName.RESULTS
    copy = answer.data_as(ToolOutcome)
    assert str(copy.invocation_id) == second.invocationid
    assert copy.result == {"message": "hi", "length": 2}

    third = _request(idempotency_key="order-7")
    late = _one(await _ask(fleet, third))[1].data_as(ToolOutcome)
    assert (str(late.invocation_id), late.result) == (third.invocationid, copy.result)


async def test_a_key_reused_for_other_parameters_conflicts(fleet: Fleet) -> None:
    _one(await _ask(fleet, _request(idempotency_key="k")))
    emitted = await _ask(fleet, _request(idempotency_key="k", parameters={"message": "other"}))
    assert _error(emitted) == ErrorCode.IDEMPOTENCY_CONFLICT


async def test_the_rate_limit_refuses_then_refills_with_time(fleet: Fleet) -> None:
    limited = POLICY.model_copy(update={"budgets": Budgets(max_calls_per_minute=1)})
    fleet.policies.policies[TENANT] = limited
    assert _one(await _ask(fleet, _request()))[0] == TopicName.AUTHORIZED
    refused = _one(await _ask(fleet, _request()))[1].data_as(ToolOutcome)
    assert refused.error is not None
    assert refused.error.code == ErrorCode.RATE_LIMIT_EXCEEDED
    assert refused.error.retry_after_s is not None
    assert refused.error.retry_after_s > 0
    fleet.clock.now += 60
    assert _one(await _ask(fleet, _request()))[0] == TopicName.AUTHORIZED


def _key(invocation_id: str) -> CallKey:
    """The call of ``invocation_id`` in the test's tenant (what stores are keyed by)."""
    return CallKey(tenant_id=TENANT, invocation_id=invocation_id)
