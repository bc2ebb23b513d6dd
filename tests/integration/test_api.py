"""The status API against the real broker, Redis and Postgres."""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest
from aiokafka import AIOKafkaConsumer
from fastapi import FastAPI

from tests.support.api import BASE_URL, ApiKeys, api_settings_for
from tests.support.eventually import eventually
from toolfleet.api import ApiSettings
from toolfleet.api.resources import ApiResources
from toolfleet.auth.control import ControlVerifier, control_claims
from toolfleet.auth.grants import ensure_grant_key
from toolfleet.auth.keys import generate_key_pair
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.bus.connection import connection_kwargs
from toolfleet.client import ApiError, InvocationHandle, connect_http
from toolfleet.contract.manifest import (
    CircuitSettings,
    FilesystemAccess,
    ResourceDefaults,
    RetrySettings,
    SourceType,
    ToolCategory,
    ToolManifest,
    ToolPermissions,
)
from toolfleet.events.codec import decode
from toolfleet.events.envelope import Envelope
from toolfleet.events.identity import CallKey, trace_id_of
from toolfleet.events.models import (
    AgentContext,
    ApprovalDecision,
    CancelRequested,
    Effect,
    InvocationStatus,
    InvokeAuthorized,
)
from toolfleet.events.types import EventType, TopicName, topic
from toolfleet.executor.registration import register_catalog
from toolfleet.policy.documents import TenantPolicy
from toolfleet.policy.postgres_policies import PolicyStore
from toolfleet.policy.redis_stores import RedisApprovalStore
from toolfleet.policy.service import PendingApproval
from toolfleet.registry.catalog import discover
from toolfleet.registry.store import RegistryStore
from toolfleet.settings import FleetSettings
from toolfleet.storage.blobs import PostgresBlobStore

pytestmark = pytest.mark.integration

PROBLEM = "application/problem+json"
_RANK = {"pending": 0, "pending_approval": 1, "running": 2}


# --- fixtures ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def api_settings(settings: FleetSettings, api_keys: ApiKeys) -> ApiSettings:
    grant_key = api_keys.private_file.parent / "grant.key"
    ensure_grant_key(grant_key)
    return api_settings_for(settings, api_keys, grant_key_file=grant_key, api_url=BASE_URL)


@pytest.fixture
def pool(app: FastAPI) -> asyncpg.Pool:
    res: ApiResources = app.state.resources
    return res.pool


@pytest.fixture
def auth(issuer: TokenIssuer) -> Callable[..., dict[str, str]]:
    def headers(
        tenant: str, *, admin: bool = False, agent: str = "did:agent:test", scope: str = ""
    ) -> dict[str, str]:
        scopes = [*(["admin"] if admin else []), *scope.split()]
        token = issuer.issue(tenant_id=tenant, agent_did=agent, scopes=scopes or None)
        return {"Authorization": f"Bearer {token}"}

    return headers


def tenant() -> str:
    return f"tenant_{uuid.uuid4().hex[:10]}"


async def insert(
    pool: asyncpg.Pool,
    *,
    tenant_id: str,
    tool_id: str = "core__echo",
    status: str = "pending",
    created_at: datetime | None = None,
    **columns: Any,
) -> uuid.UUID:
    """A row of the status projection, as the status service would write it."""
    invocation_id = uuid.uuid4()
    values = {
        "invocation_id": invocation_id,
        "tenant_id": tenant_id,
        "tool_id": tool_id,
        "status": status,
        "status_rank": _RANK.get(status, 9),
        "created_at": created_at or datetime.now(UTC),
        **columns,
    }
    names = ", ".join(values)
    marks = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    await pool.execute(
        f"INSERT INTO tool_invocations ({names}) VALUES ({marks})",  # noqa: S608 - test data
        *values.values(),
    )
    return invocation_id


async def park(
    app: FastAPI, invocation_id: uuid.UUID, *, tenant_id: str, agent_did: str, digest: str
) -> None:
    """The approval policy parks for a call (what the API judges a decider against)."""
    res: ApiResources = app.state.resources
    pending = PendingApproval(
        authorized=InvokeAuthorized(
            invocation_id=invocation_id,
            tool_id="core__echo",
            tool_version="1.0.0",
            requested_version="*",
            agent_context=AgentContext(agent_did=agent_did, tenant_id=tenant_id),
            parameters={"message": "hi"},
            effect=Effect.EXTERNAL_SIDE_EFFECT,
            timeout_seconds=30,
            requested_at=datetime.now(UTC),
        ),
        parameters_hash=digest,
        expires_at=datetime.now(UTC) + timedelta(hours=1),
        tenant_id=tenant_id,
        traceparent=None,
        authid=agent_did,
    )
    call = CallKey(tenant_id=tenant_id, invocation_id=str(invocation_id))
    await RedisApprovalStore(res.redis).put(call, pending, ttl_s=3600)


async def next_event(
    settings: FleetSettings, name: TopicName, match: Callable[[Envelope], bool]
) -> tuple[bytes | None, Envelope]:
    """The first event on ``name`` (from the beginning) that ``match`` accepts."""
    consumer = AIOKafkaConsumer(
        topic(settings.topic_prefix, name),
        **connection_kwargs(settings),
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    try:
        found: list[tuple[bytes | None, Envelope]] = []

        async def scan() -> bool:
            batch = await consumer.getmany(timeout_ms=100)
            for records in batch.values():
                for r in records:
                    envelope = decode(key=r.key, value=r.value, headers=list(r.headers))
                    if match(envelope):
                        found.append((r.key, envelope))
            return bool(found)

        await eventually(scan, timeout=15)
        return found[0]
    finally:
        await consumer.stop()


def invoke_body(tenant_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "tool_id": "core__echo",
        "agent_context": {"agent_did": "did:agent:test", "tenant_id": tenant_id},
        "parameters": {"message": "hi"},
        **extra,
    }


# --- health --------------------------------------------------------------------------


async def test_health_readiness_and_openapi(http: httpx.AsyncClient) -> None:
    assert (await http.get("/healthz")).json() == {"status": "ok"}
    ready = await http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"kafka": "ok", "redis": "ok", "postgres": "ok"}
    spec = (await http.get("/openapi.json")).json()
    assert "/v1/invocations/{invocation_id}/cancel" in spec["paths"]
    unauthorized = spec["paths"]["/v1/invocations"]["get"]["responses"]["401"]
    assert list(unauthorized["content"]) == [PROBLEM]


async def test_metrics_are_labelled_by_route_template(
    http: httpx.AsyncClient, auth: Callable[..., dict[str, str]]
) -> None:
    caller = tenant()
    await http.get(f"/v1/invocations/{uuid.uuid4()}", headers=auth(caller))
    text = (await http.get("/metrics")).text
    assert 'route="/v1/invocations/{invocation_id}"' in text
    assert "toolfleet_http_request_seconds_bucket" in text
    # No label carries a tenant: neither this caller nor any other test's tenant.
    assert caller not in text
    assert not re.search(r"tenant_[0-9a-f]{10}", text)


# --- authentication ------------------------------------------------------------------


async def test_no_or_bad_token_is_401_problem(http: httpx.AsyncClient) -> None:
    missing = await http.get("/v1/invocations")
    assert missing.status_code == 401
    assert missing.headers["content-type"] == PROBLEM
    assert missing.headers["www-authenticate"] == "Bearer"
    problem = missing.json()
    assert {"type", "title", "status", "detail", "instance"} <= problem.keys()
    assert problem["status"] == 401
    assert problem["instance"] == "/v1/invocations"

    bad = await http.get("/v1/tools", headers={"Authorization": "Bearer not.a.jwt-secret"})
    assert bad.status_code == 401
    assert bad.headers["content-type"] == PROBLEM
    assert "not.a.jwt-secret" not in bad.text


async def test_token_from_another_key_is_401(http: httpx.AsyncClient) -> None:
    other = generate_key_pair()
    forged = TokenIssuer(
        other.private_pem, other.public_pem, issuer="toolfleet", audience="toolfleet"
    ).issue(tenant_id="t", agent_did="did:agent:x", scopes=["admin"])
    response = await http.get("/v1/tools", headers={"Authorization": f"Bearer {forged}"})
    assert response.status_code == 401
    assert forged not in response.text


# --- reading invocations -------------------------------------------------------------


async def test_get_invocation_is_tenant_scoped(
    http: httpx.AsyncClient, pool: asyncpg.Pool, auth: Callable[..., dict[str, str]]
) -> None:
    owner = tenant()
    invocation_id = await insert(
        pool,
        tenant_id=owner,
        status="success",
        tool_version="1.0.0",
        progress_percent=100.0,
        current_phase="done",
        result={"message": "hi", "length": 2},
        execution_metadata={"duration_ms": 3, "attempts": 1},
        warnings=["deprecated"],
    )
    mine = await http.get(f"/v1/invocations/{invocation_id}", headers=auth(owner))
    assert mine.status_code == 200
    body = mine.json()
    assert body["invocation_id"] == str(invocation_id)
    assert body["status"] == "success"
    assert body["result"] == {"message": "hi", "length": 2}
    assert body["tool_version"] == "1.0.0"
    assert body["warnings"] == ["deprecated"]
    assert {"error", "latest_checkpoint", "created_at", "completed_at"} <= body.keys()

    theirs = await http.get(f"/v1/invocations/{invocation_id}", headers=auth(tenant()))
    assert theirs.status_code == 404
    assert theirs.headers["content-type"] == PROBLEM
    assert owner not in theirs.text

    admin = await http.get(f"/v1/invocations/{invocation_id}", headers=auth("ops", admin=True))
    assert admin.status_code == 200

    unknown = await http.get(f"/v1/invocations/{uuid.uuid4()}", headers=auth(owner))
    assert unknown.status_code == 404


async def test_list_pages_newest_first_with_filters(
    http: httpx.AsyncClient, pool: asyncpg.Pool, auth: Callable[..., dict[str, str]]
) -> None:
    owner = tenant()
    base = datetime.now(UTC) - timedelta(minutes=5)
    ids = []
    for i in range(5):
        ids.append(await insert(pool, tenant_id=owner, created_at=base + timedelta(seconds=i)))
    # Two rows with the same timestamp: the id breaks the tie, none is skipped.
    same = base + timedelta(seconds=10)
    ids += [await insert(pool, tenant_id=owner, created_at=same) for _ in range(2)]
    other_tool = await insert(
        pool,
        tenant_id=owner,
        tool_id="core__long_running",
        status="running",
        created_at=base + timedelta(seconds=20),
    )
    await insert(pool, tenant_id=tenant(), created_at=base + timedelta(seconds=30))

    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = (await http.get("/v1/invocations", params=params, headers=auth(owner))).json()
        seen += [item["invocation_id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    tied = sorted(ids[5:], key=str, reverse=True)
    expected = [other_tool, *tied, *reversed(ids[:5])]
    assert seen == [str(i) for i in expected]

    running = await http.get("/v1/invocations", params={"status": "running"}, headers=auth(owner))
    assert [i["invocation_id"] for i in running.json()["items"]] == [str(other_tool)]
    echo = await http.get("/v1/invocations", params={"tool_id": "core__echo"}, headers=auth(owner))
    assert len(echo.json()["items"]) == 7
    assert echo.json()["next_cursor"] is None


async def test_list_rejects_bad_limit_and_cursor(
    http: httpx.AsyncClient, auth: Callable[..., dict[str, str]]
) -> None:
    too_many = await http.get("/v1/invocations", params={"limit": 201}, headers=auth(tenant()))
    assert too_many.status_code == 422
    assert too_many.headers["content-type"] == PROBLEM
    assert [e["field"] for e in too_many.json()["errors"]] == ["query.limit"]
    assert "201" not in str(too_many.json()["errors"])

    garbage = await http.get("/v1/invocations", params={"cursor": "zzz"}, headers=auth(tenant()))
    assert garbage.status_code == 422


# --- submitting ----------------------------------------------------------------------


async def test_post_publishes_invoke_requested_keyed_by_tenant(
    http: httpx.AsyncClient,
    settings: FleetSettings,
    issuer: TokenIssuer,
) -> None:
    owner = tenant()
    token = issuer.issue(tenant_id=owner, agent_did="did:agent:test", tool_id="core__echo")
    response = await http.post(
        "/v1/invocations", json=invoke_body(owner), headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 202
    accepted = response.json()
    invocation_id = accepted["invocation_id"]
    assert accepted["status"] == "pending"
    assert accepted["polling_info"] == {
        "status_url": f"http://api.test/v1/invocations/{invocation_id}",
        "poll_interval_ms": 500,
    }

    key, event = await next_event(
        settings, TopicName.REQUESTED, lambda e: e.invocationid == invocation_id
    )
    assert key == owner.encode()
    assert event.type == EventType.INVOKE_REQUESTED
    assert event.tenantid == owner
    assert event.source == "/toolfleet/api"
    assert event.data["tool_id"] == "core__echo"
    assert event.data["parameters"] == {"message": "hi"}
    # No capability_token in the body: the bearer token is the capability.
    assert event.data["capability_token"] == token


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
        ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-later", True),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),
        ("not a traceparent", False),
        (None, False),
    ],
)
async def test_post_joins_the_callers_trace_or_starts_one(
    http: httpx.AsyncClient,
    settings: FleetSettings,
    auth: Callable[..., dict[str, str]],
    sent: str | None,
    kept: bool,
) -> None:
    owner = tenant()
    headers = auth(owner) | ({"traceparent": sent} if sent is not None else {})
    response = await http.post("/v1/invocations", json=invoke_body(owner), headers=headers)
    assert response.status_code == 202
    invocation_id = response.json()["invocation_id"]
    _, event = await next_event(
        settings, TopicName.REQUESTED, lambda e: e.invocationid == invocation_id
    )
    trace_id = trace_id_of(event.traceparent)
    assert trace_id is not None
    assert (trace_id == "4bf92f3577b34da6a3ce929d0e0e4736") is kept


async def test_the_http_client_publishes_and_reads_through_the_app(
    app: FastAPI,
    pool: asyncpg.Pool,
    settings: FleetSettings,
    issuer: TokenIssuer,
) -> None:
    owner = tenant()
    token = issuer.issue(tenant_id=owner, agent_did="did:agent:test", tool_id="core__echo")
    transport = httpx.ASGITransport(app=app)
    async with connect_http("http://api.test", token=token, transport=transport) as api:
        handle = await api.invoke(
            "core__echo", {"message": "hi"}, tenant_id=owner, agent_did="did:agent:test"
        )
        key, event = await next_event(
            settings, TopicName.REQUESTED, lambda e: e.invocationid == handle.invocation_id
        )
        assert key == owner.encode()
        assert event.data["capability_token"] == token  # the bearer token is the capability

        finished = await insert(pool, tenant_id=owner, status="success", result={"length": 2})
        outcome = await api.wait(
            InvocationHandle(
                invocation_id=str(finished), tenant_id=owner, event_id="", traceparent=""
            ),
            timeout=5,
        )
        assert outcome.status is InvocationStatus.SUCCESS
        assert outcome.result == {"length": 2}
        assert await api.status(str(uuid.uuid4())) is None

        with pytest.raises(ApiError) as caught:
            await api.invoke("core__echo", tenant_id="someone_else", agent_did="did:agent:x")
    assert (caught.value.status, caught.value.problem_code) == (403, "permission_denied")
    assert token not in str(caught.value)


async def test_post_for_another_tenant_is_403(
    http: httpx.AsyncClient, auth: Callable[..., dict[str, str]]
) -> None:
    response = await http.post(
        "/v1/invocations", json=invoke_body("someone_else"), headers=auth(tenant())
    )
    assert response.status_code == 403
    assert response.headers["content-type"] == PROBLEM
    assert response.json()["code"] == "permission_denied"


async def test_post_invalid_body_lists_fields_without_values(
    http: httpx.AsyncClient, auth: Callable[..., dict[str, str]]
) -> None:
    owner = tenant()
    body = invoke_body(owner, capability_token="secret-token-value", bogus_field="leak-me")
    body["agent_context"]["tenant_id"] = "bad tenant!"
    response = await http.post("/v1/invocations", json=body, headers=auth(owner))
    assert response.status_code == 422
    assert response.headers["content-type"] == PROBLEM
    fields = {e["field"] for e in response.json()["errors"]}
    assert fields == {"body.bogus_field", "body.agent_context.tenant_id"}
    for secret in ("secret-token-value", "leak-me", "bad tenant!"):
        assert secret not in response.text


# --- control -------------------------------------------------------------------------


async def test_cancel(
    http: httpx.AsyncClient,
    pool: asyncpg.Pool,
    settings: FleetSettings,
    api_settings: ApiSettings,
    auth: Callable[..., dict[str, str]],
) -> None:
    owner = tenant()
    finished = await insert(pool, tenant_id=owner, status="success")
    response = await http.post(f"/v1/invocations/{finished}/cancel", headers=auth(owner))
    assert response.status_code == 200
    assert response.json()["cancelled"] is False
    assert "success" in response.json()["message"]

    running = await insert(pool, tenant_id=owner, status="running")
    other = await http.post(f"/v1/invocations/{running}/cancel", headers=auth(tenant()))
    assert other.status_code == 404
    response = await http.post(
        f"/v1/invocations/{running}/cancel",
        json={"reason": "no longer needed"},
        headers=auth(owner, agent="did:agent:boss"),
    )
    assert response.json() == {
        "invocation_id": str(running),
        "cancelled": True,
        "message": "cancellation requested",
    }
    key, event = await next_event(
        settings, TopicName.CONTROL, lambda e: e.invocationid == str(running)
    )
    assert key == owner.encode()
    assert event.type == EventType.CANCEL_REQUESTED
    assert event.data["requested_by"] == "did:agent:boss"
    cancel = CancelRequested.model_validate(event.data)
    verifier = ControlVerifier.from_settings(api_settings)
    assert verifier is not None
    verifier.verify(cancel.signature, control_claims(event.type, cancel))
    assert event.data["reason"] == "no longer needed"


async def test_approve_and_deny(
    app: FastAPI,
    http: httpx.AsyncClient,
    pool: asyncpg.Pool,
    api_settings: ApiSettings,
    auth: Callable[..., dict[str, str]],
) -> None:
    owner = tenant()
    approver = auth(owner, agent="did:user:alice", scope="approver")
    verifier = ControlVerifier.from_settings(api_settings)
    assert verifier is not None
    running = await insert(pool, tenant_id=owner, status="running", agent_did="did:agent:test")
    conflict = await http.post(f"/v1/invocations/{running}/approve", headers=approver)
    assert conflict.status_code == 409
    assert conflict.headers["content-type"] == PROBLEM
    assert conflict.json()["code"] == "state_conflict"

    digest = "c" * 64
    waiting = await insert(
        pool,
        tenant_id=owner,
        status="pending_approval",
        agent_did="did:agent:test",
        parameters={"message": "hi"},
        parameters_hash=digest,
    )
    # A row that says pending_approval is not enough: only a parked call is decided.
    nothing_parked = await http.post(f"/v1/invocations/{waiting}/approve", headers=approver)
    assert nothing_parked.status_code == 409
    await park(app, waiting, tenant_id=owner, agent_did="did:agent:test", digest=digest)
    # The requesting agent's own token never decides, whatever its scope.
    for headers in (auth(owner), auth(owner, scope="approver")):
        refused = await http.post(f"/v1/invocations/{waiting}/approve", headers=headers)
        assert refused.status_code == 403
        assert refused.headers["content-type"] == PROBLEM
        assert refused.json()["code"] == "permission_denied"
    # An approver of another tenant does not even see the call.
    other = auth(tenant(), agent="did:user:alice", scope="approver")
    assert (await http.post(f"/v1/invocations/{waiting}/approve", headers=other)).status_code == 404

    approved = await http.post(f"/v1/invocations/{waiting}/approve", headers=approver)
    assert approved.status_code == 200
    assert approved.json()["decision"] == "approved"
    _, event = await next_event(
        api_settings, TopicName.CONTROL, lambda e: e.invocationid == str(waiting)
    )
    assert event.type == EventType.APPROVAL_GRANTED
    decision = ApprovalDecision.model_validate(event.data)
    assert decision.approver == "did:user:alice"
    assert decision.parameters_hash == digest  # what GET showed the approver
    verifier.verify(decision.signature, control_claims(event.type, decision))

    refused_id = await insert(
        pool, tenant_id=owner, status="pending_approval", agent_did="did:agent:test"
    )
    await park(app, refused_id, tenant_id=owner, agent_did="did:agent:test", digest=digest)
    admin = auth("*", admin=True, agent="did:user:root")
    denied = await http.post(f"/v1/invocations/{refused_id}/deny", headers=admin)
    assert denied.json()["decision"] == "denied"
    _, event = await next_event(
        api_settings, TopicName.CONTROL, lambda e: e.invocationid == str(refused_id)
    )
    assert event.type == EventType.APPROVAL_DENIED
    denial = ApprovalDecision.model_validate(event.data)
    verifier.verify(denial.signature, control_claims(event.type, denial))


async def test_a_pending_call_shows_what_an_approval_binds_to(
    http: httpx.AsyncClient, pool: asyncpg.Pool, auth: Callable[..., dict[str, str]]
) -> None:
    owner = tenant()
    waiting = await insert(
        pool,
        tenant_id=owner,
        status="pending_approval",
        tool_version="1.0.0",
        agent_did="did:agent:test",
        parameters={"to": "[REDACTED:email]"},
        parameters_hash="d" * 64,
    )
    view = (await http.get(f"/v1/invocations/{waiting}", headers=auth(owner))).json()
    assert view["agent_did"] == "did:agent:test"
    assert view["approval"] == {
        "tool_id": "core__echo",
        "tool_version": "1.0.0",
        "parameters": {"to": "[REDACTED:email]"},
        "parameters_hash": "d" * 64,
    }
    done = await insert(pool, tenant_id=owner, status="success", parameters={"to": "x"})
    assert (await http.get(f"/v1/invocations/{done}", headers=auth(owner))).json()[
        "approval"
    ] is None


# --- registry ------------------------------------------------------------------------


async def test_tools_list_and_detail(
    http: httpx.AsyncClient, pool: asyncpg.Pool, auth: Callable[..., dict[str, str]]
) -> None:
    await register_catalog(pool, discover([]))
    caller = tenant()
    # The catalog shows what the tenant's policy allows (tests/integration/test_api_policies.py).
    await PolicyStore(pool).put(caller, TenantPolicy(allow_tools=["core__*"]), "test")
    headers = auth(caller)
    listing = (await http.get("/v1/tools", headers=headers)).json()
    by_id = {t["tool_id"]: t for t in listing["items"]}
    assert {"core__echo", "core__get_current_time", "core__long_running"} <= by_id.keys()
    echo = by_id["core__echo"]
    assert (echo["tool_name"], echo["latest_version"], echo["requires_approval"]) == (
        "echo",
        "1.0.0",
        False,
    )
    assert [(v["version"], v["lifecycle_state"], v["deprecated"]) for v in echo["versions"]] == [
        ("1.0.0", "active", False)
    ]
    assert listing["page"] == 1
    assert listing["total"] >= 3

    found = (
        await http.get("/v1/tools", params={"q": "what time is it now"}, headers=headers)
    ).json()
    assert found["items"][0]["tool_id"] == "core__get_current_time"
    assert found["items"][0]["score"] >= 0.25
    assert found["total"] < listing["total"]  # tools that do not match are left out
    everything = (
        await http.get(
            "/v1/tools", params={"q": "what time is it now", "min_score": -1}, headers=headers
        )
    ).json()
    assert everything["total"] == listing["total"]
    paged = await http.get("/v1/tools", params={"page_size": 1, "page": 2}, headers=headers)
    assert len(paged.json()["items"]) == 1

    detail = await http.get("/v1/tools/core__echo", headers=headers)
    assert detail.status_code == 200
    manifest = detail.json()["versions"][0]
    assert manifest["version"] == "1.0.0"
    assert manifest["input_schema"]["properties"]["message"]["type"] == "string"
    assert manifest["category"] == "core"
    assert manifest["source_type"] == "native"
    assert manifest["circuit"]["name"] == "core__echo"
    assert manifest["retry_policy"]["max_attempts"] == 1
    assert manifest["permissions"] == {"filesystem": [], "network": [], "credentials": []}

    missing = await http.get("/v1/tools/core__nope", headers=headers)
    assert missing.status_code == 404
    assert missing.headers["content-type"] == PROBLEM


async def test_a_manifest_is_served_as_registered(
    http: httpx.AsyncClient, pool: asyncpg.Pool, auth: Callable[..., dict[str, str]]
) -> None:
    tool_id = f"acme__m{uuid.uuid4().hex[:8]}"
    registered = ToolManifest(
        tool_id=tool_id,
        version="1.2.0",
        effect=Effect.EXTERNAL_SIDE_EFFECT,
        description="Post a message to a chat channel.",
        category=ToolCategory.COMMUNICATION,
        tags=["chat"],
        source_type=SourceType.HTTP,
        input_schema={"type": "object"},
        output_schema={"type": "object"},
        redaction_allowlist=[],
        timeout_seconds=10,
        permissions=ToolPermissions(
            network=["chat.example.com"],
            filesystem=[FilesystemAccess(path="/tmp/out", access="write")],
            credentials=["chat_token"],
        ),
        retry_policy=RetrySettings(max_attempts=3),
        circuit=CircuitSettings(name="chat.example.com", failure_rate=0.25),
        requires_approval=True,
        resource_defaults=ResourceDefaults(memory_mb_limit=256),
    )
    await RegistryStore(pool).register(registered)
    headers = auth(tenant(), admin=True)
    detail = (await http.get(f"/v1/tools/{tool_id}", headers=headers)).json()
    assert detail["requires_approval"] is True
    assert ToolManifest.model_validate(detail["versions"][0]) == registered
    assert detail["versions"][0]["credentials"] == ["chat_token"]  # both spellings agree
    listed = (await http.get("/v1/tools", params={"tag": "chat"}, headers=headers)).json()
    summary = next(t for t in listed["items"] if t["tool_id"] == tool_id)
    assert (summary["latest_version"], summary["requires_approval"]) == ("1.2.0", True)


async def test_unknown_route_is_problem(http: httpx.AsyncClient) -> None:
    response = await http.get("/v2/nothing")
    assert response.status_code == 404
    assert response.headers["content-type"] == PROBLEM


async def test_readyz_names_the_unreachable_dependency(
    app: FastAPI, http: httpx.AsyncClient
) -> None:
    res: ApiResources = app.state.resources
    dead = dataclasses.replace(
        res,
        settings=res.settings.model_copy(
            update={"kafka_bootstrap": "127.0.0.1:1", "readiness_timeout_s": 0.5}
        ),
    )
    app.state.resources = dead
    try:
        response = await http.get("/readyz")
    finally:
        app.state.resources = res
    assert response.status_code == 503
    assert response.headers["content-type"] == PROBLEM
    problem = response.json()
    assert problem["checks"] == {"kafka": "unreachable", "redis": "ok", "postgres": "ok"}
    assert "kafka" in problem["detail"]


# --- attachments ---------------------------------------------------------------------


async def test_attachment_is_served_to_its_tenant_only(
    http: httpx.AsyncClient, pool: asyncpg.Pool, auth: Callable[..., dict[str, str]]
) -> None:
    owner, invocation = tenant(), str(uuid.uuid4())
    blobs = PostgresBlobStore(pool)
    whole = b'{"rows":[1,2,3]}'
    blob_id = await blobs.put(
        whole, tenant_id=owner, invocation_id=invocation, purpose="attachment"
    )
    url = f"/v1/invocations/{invocation}/attachments/{blob_id}"

    got = await http.get(url, headers=auth(owner))
    assert got.status_code == 200
    assert got.content == whole
    assert got.headers["content-type"] == "application/json"
    assert (await http.get(url, headers=auth("ops", admin=True))).content == whole

    other = await http.get(url, headers=auth(tenant()))
    assert other.status_code == 404
    assert other.headers["content-type"] == PROBLEM
    elsewhere = f"/v1/invocations/{uuid.uuid4()}/attachments/{blob_id}"
    assert (await http.get(elsewhere, headers=auth(owner))).status_code == 404
    assert (await http.get(url)).status_code == 401


async def test_transfer_blobs_are_never_served(
    http: httpx.AsyncClient, pool: asyncpg.Pool, auth: Callable[..., dict[str, str]]
) -> None:
    # A transfer blob is the tool's raw result, before validation and redaction.
    owner, invocation = tenant(), str(uuid.uuid4())
    blob_id = await PostgresBlobStore(pool).put(
        b'{"secret":"raw"}', tenant_id=owner, invocation_id=invocation, purpose="transfer"
    )
    got = await http.get(f"/v1/invocations/{invocation}/attachments/{blob_id}", headers=auth(owner))
    assert got.status_code == 404
