"""Hostile and malformed invoke events through the real broker: nothing kills a consumer.

Hypothesis draws a bounded, derandomized set of hostile messages (wrong types, huge
strings, deep nesting, unicode tricks, forged tenants, bad tokens, oversized values,
non-JSON bytes, wrong content types, broken CloudEvent attributes). They are published
together, with valid calls sent before, between and after them, to an in-process
fleet of every service (``TOOLFLEET_MAX_EVENT_BYTES`` = 64 KiB). Then:

* every hostile message has a typed terminal outcome or a DLQ record;
* every valid call succeeded;
* every consumer task of every service is still running.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.support.eventually import eventually
from tests.support.pipeline import fleet_settings
from toolfleet.auth.keys import generate_key_pair
from toolfleet.auth.tokens import TokenIssuer
from toolfleet.bus.admin import ensure_topics
from toolfleet.bus.connection import connection_kwargs
from toolfleet.bus.runtime import EventConsumer
from toolfleet.client import InvocationHandle, KafkaPublisher
from toolfleet.errors import ErrorCode
from toolfleet.events.codec import decode
from toolfleet.events.identity import invocation_uuid
from toolfleet.events.models import InvocationStatus, ToolOutcome
from toolfleet.events.types import EventType, TopicName, topic
from toolfleet.settings import FleetSettings
from toolfleet.worker import SERVICES, load_build, open_resources

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

AGENT = "did:agent:test"
LIMIT = 64 * 1024
EXAMPLES = 60


@dataclass
class Running:
    settings: FleetSettings
    issuer: TokenIssuer
    client: KafkaPublisher
    consumers: list[EventConsumer]
    tasks: list[asyncio.Task[None]]

    def topic(self, name: TopicName) -> str:
        return topic(self.settings.topic_prefix, name)

    def token(self, tenant: str = "t1", **kw: Any) -> str:
        return self.issuer.issue(tenant_id=tenant, agent_did=AGENT, **kw)


@pytest.fixture(scope="module")
async def running(
    settings: FleetSettings, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Running]:
    home: Path = tmp_path_factory.mktemp("hostile")
    local = fleet_settings(settings, home, max_event_bytes=LIMIT)
    await ensure_topics(local)
    stop = asyncio.Event()
    async with contextlib.AsyncExitStack() as stack:
        consumers: list[EventConsumer] = []
        for name in SERVICES:  # every service: audit and status read the hostile input too
            res = await stack.enter_async_context(open_resources(local, service=name))
            consumers.extend(await load_build(name)(res))
        tasks = [asyncio.create_task(c.run(stop)) for c in consumers]
        await asyncio.wait_for(asyncio.gather(*(c.assigned.wait() for c in consumers)), 60)
        client = await stack.enter_async_context(KafkaPublisher(local))
        assert local.jwt_private_key_file
        assert local.jwt_public_key_file
        issuer = TokenIssuer.from_files(
            local.jwt_private_key_file,
            local.jwt_public_key_file,
            issuer=local.jwt_issuer,
            audience=local.jwt_audience,
        )
        try:
            yield Running(local, issuer, client, consumers, tasks)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)


# --- hostile messages ------------------------------------------------------------------


@dataclass
class Hostile:
    """One raw Kafka message and the invocation ids its outcome may carry."""

    kind: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    invocation_ids: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Tokens:
    """Token factories, built once (RSA keys are slow to make)."""

    valid: Callable[[str], str]
    bad: dict[str, str]


def _b64url(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")


def make_tokens(run: Running) -> Tokens:
    import jwt

    other = generate_key_pair()
    forged = TokenIssuer(
        other.private_pem, other.public_pem, issuer="toolfleet", audience="toolfleet"
    )
    claims = {
        "tenant_id": "t1",
        "agent_did": AGENT,
        "iss": "toolfleet",
        "aud": "toolfleet",
        "iat": 1,
        "exp": 4_000_000_000,
    }
    assert run.settings.jwt_public_key_file
    public_pem = run.settings.jwt_public_key_file.read_bytes()
    bad = {
        "expired": run.token(ttl_s=-600),
        "none_alg": f"{_b64url({'alg': 'none', 'typ': 'JWT'})}.{_b64url(claims)}.",
        "wrong_key": forged.issue(tenant_id="t1", agent_did=AGENT),
        "hs256_with_public_key": jwt.encode(claims, public_pem.decode(), algorithm="HS256")
        if hasattr(jwt, "encode") and _hmac_allowed(public_pem)
        else "eyJhbGciOiJIUzI1NiJ9.e30.c2ln",
        "other_tenant": run.token("t2"),
        "garbage": "not.a.jwt",
        "empty": "",
        "huge": "a" * 20_000,
        "tampered": run.token()[:-4] + "AAAA",
    }
    return Tokens(valid=lambda tenant: run.token(tenant), bad=bad)


def _hmac_allowed(pem: bytes) -> bool:
    import jwt

    try:
        jwt.encode({}, pem.decode(), algorithm="HS256")
    except jwt.exceptions.InvalidKeyError:
        return False  # PyJWT itself refuses a PEM as an HMAC key: use a fixed forgery
    return True


JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
FIELDS = [
    ("tool_id",),
    ("tool_version",),
    ("agent_context",),
    ("agent_context", "tenant_id"),
    ("agent_context", "agent_did"),
    ("parameters",),
    ("parameters", "message"),
    ("capability_token",),
    ("connection_id",),
    ("resource_limits",),
    ("resource_limits", "timeout_seconds"),
    ("checkpoint_config",),
    ("execution_options",),
    ("execution_options", "require_approval"),
    ("unknown_field",),
]
TRICKS = [
    "\u202eevil\u202c",  # right-to-left override
    "a\x00b",  # NUL
    "\ud800",  # lone high surrogate (escaped in the JSON)
    "\udfff x",  # lone low surrogate
    "\ufeffbom",
    "zero\u200bwidth",
    "t\u0430cme",  # Cyrillic a
    "\u0442\u0031",  # Cyrillic te + 1: looks like t1
    "e\u0301",  # combining accent
    "\U0001f4a3" * 50,
]


def _set(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node: Any = data
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def _request(iid: str, token: str, tenant: str = "t1") -> dict[str, Any]:
    return {
        "invocation_id": iid,
        "tool_id": "core__echo",
        "agent_context": {"agent_did": AGENT, "tenant_id": tenant},
        "parameters": {"message": "hostile"},
        "capability_token": token,
    }


def _binary(
    iid: str,
    data: dict[str, Any] | bytes,
    *,
    key: bytes | None = b"t1",
    tenantid: bytes | None = b"t1",
    content_type: bytes | None = b"application/json",
    drop: tuple[str, ...] = (),
    ce_type: bytes = EventType.INVOKE_REQUESTED.encode(),
) -> tuple[bytes | None, bytes, list[tuple[str, bytes]]]:
    value = data if isinstance(data, bytes) else json.dumps(data).encode()  # ensure_ascii
    headers = [
        ("ce_specversion", b"1.0"),
        ("ce_id", iid.encode()),
        ("ce_source", b"/test/hostile"),
        ("ce_type", ce_type),
        ("ce_invocationid", iid.encode()),
    ]
    if tenantid is not None:
        headers.append(("ce_tenantid", tenantid))
    if content_type is not None:
        headers.append(("content-type", content_type))
    return key, value, [(k, v) for k, v in headers if k not in drop]


@st.composite
def hostile(draw: st.DrawFn, tokens: Tokens) -> Hostile:
    iid = str(uuid.UUID(int=draw(st.integers(min_value=1, max_value=2**122))))
    token = tokens.valid("t1")
    kind = draw(
        st.sampled_from(
            [
                "wrong_type",
                "huge_string",
                "deep_nesting",
                "unicode",
                "forged_tenant",
                "bad_token",
                "oversized",
                "non_json",
                "wrong_content_type",
                "broken_attributes",
                "structured_garbage",
                "bad_invocation_id",
            ]
        )
    )
    data = _request(iid, token)
    ids = {iid}
    if kind == "wrong_type":
        _set(data, draw(st.sampled_from(FIELDS)), draw(JUNK))
        key, value, headers = _binary(iid, data)
    elif kind == "huge_string":
        path = draw(st.sampled_from(FIELDS[:9]))
        size = draw(st.integers(min_value=1_000, max_value=LIMIT // 2))
        _set(data, path, draw(st.sampled_from(["x", "\u00e9", "\U0001f600", "\\"])) * size)
        key, value, headers = _binary(iid, data)
    elif kind == "deep_nesting":
        depth = draw(st.sampled_from([100, 500, 900, 980, 1_100, 5_000]))
        raw = json.dumps(data).encode()
        nested = b"[" * depth + b"]" * depth
        if draw(st.booleans()):
            nested = b'{"a":' * depth + b"1" + b"}" * depth
        value = raw.replace(b'"hostile"', nested)
        key, value, headers = _binary(iid, value)
    elif kind == "unicode":
        trick = draw(st.sampled_from(TRICKS))
        where = draw(st.sampled_from(["tool_id", "agent_did", "tenant", "message", "key"]))
        key, tenantid = b"t1", b"t1"
        if where == "tool_id":
            data["tool_id"] = f"core__echo{trick}"
        elif where == "agent_did":
            data["agent_context"]["agent_did"] = trick
        elif where == "message":
            data["parameters"]["message"] = trick
        else:
            raw_tenant = trick.encode("utf-8", "surrogatepass")
            key = raw_tenant
            if where == "tenant":
                data["agent_context"]["tenant_id"] = trick
                tenantid = raw_tenant
        key, value, headers = _binary(iid, data, key=key, tenantid=tenantid)
    elif kind == "forged_tenant":
        tenants = st.sampled_from(["t1", "t2", "t_other", "T1", "t1 "])
        k, h, b = draw(tenants), draw(st.one_of(st.none(), tenants)), draw(tenants)
        if k == b and h in {None, b}:
            k = b + "x"
        data["agent_context"]["tenant_id"] = b
        data["capability_token"] = tokens.valid(b.strip() or "t1") if b.strip() else token
        key, value, headers = _binary(
            iid, data, key=k.encode(), tenantid=h.encode() if h is not None else None
        )
    elif kind == "bad_token":
        data["capability_token"] = tokens.bad[draw(st.sampled_from(sorted(tokens.bad)))]
        key, value, headers = _binary(iid, data)
    elif kind == "oversized":
        data["parameters"]["message"] = "o" * draw(st.integers(LIMIT + 1, 3 * LIMIT))
        key, value, headers = _binary(iid, data)
    elif kind == "non_json":
        blob = draw(st.binary(min_size=1, max_size=2_000))
        key, value, headers = _binary(iid, b"\xff" + blob)
    elif kind == "wrong_content_type":
        ctype = draw(
            st.sampled_from(
                [
                    None,
                    b"text/plain",
                    b"application/xml",
                    b"application/octet-stream",
                    b"application/cloudevents+xml",
                    b"application/cloudevents-batch+json",
                    b"",
                    b"\xff\xfe",
                ]
            )
        )
        key, value, headers = _binary(iid, data, content_type=ctype)
    elif kind == "broken_attributes":
        choice = draw(
            st.sampled_from(
                [
                    "drop_id",
                    "drop_source",
                    "drop_type",
                    "specversion",
                    "no_headers",
                    "other_type",
                    "no_key",
                ]
            )
        )
        drop = {
            "drop_id": ("ce_id",),
            "drop_source": ("ce_source",),
            "drop_type": ("ce_type",),
        }.get(choice, ())
        key, value, headers = _binary(iid, data, drop=drop)
        if choice == "specversion":
            headers = [(k, b"0.3" if k == "ce_specversion" else v) for k, v in headers]
        elif choice == "no_headers":
            headers = []
        elif choice == "other_type":
            key, value, headers = _binary(iid, data, ce_type=b"ai.agent.tool.cancel.requested")
        elif choice == "no_key":
            key = None
    elif kind == "structured_garbage":
        body = draw(st.one_of(st.binary(max_size=500), st.just(b"[]"), st.just(b'{"data": 1}')))
        key, value = b"t1", body
        headers = [("content-type", b"application/cloudevents+json")]
    else:  # bad_invocation_id
        # Not a UUID; or a lone surrogate, which JSON carries as \ud800 (it has no UTF-8)
        bad = draw(st.sampled_from([f"not-a-uuid-{iid}", f"\ud800{iid}"]))
        data["invocation_id"] = bad
        ids.add(invocation_uuid(bad, tenant_id="t1"))
        key, value, headers = _binary(iid, data)
    return Hostile(kind=kind, key=key, value=value, headers=headers, invocation_ids=ids)


def draw_cases(tokens: Tokens) -> list[Hostile]:
    """``EXAMPLES`` hostile messages, the same ones on every run (derandomized)."""
    cases: list[Hostile] = []

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(hostile(tokens))
    def collect(case: Hostile) -> None:
        cases.append(case)

    collect()
    # Hypothesis repeats simple draws, ids included. A second message with the same
    # ``source`` + ``id`` is a redelivery, processed once by contract: not a case of its own.
    unique: list[Hostile] = []
    seen: set[str] = set()
    for case in cases:
        if case.invocation_ids.isdisjoint(seen):
            unique.append(case)
            seen |= case.invocation_ids
    return unique + pinned_cases(tokens)


def pinned_cases(tokens: Tokens) -> list[Hostile]:
    """Nesting depths around the JSON decoder's limit, always sent (drawn ones may miss them)."""
    cases = []
    for depth in (100, 500, 900, 950, 980, 1_100, 5_000):
        for opener, closer, leaf in ((b"[", b"]", b""), (b'{"a":', b"}", b"1")):
            iid = str(uuid.uuid4())
            raw = json.dumps(_request(iid, tokens.valid("t1"))).encode()
            nested = opener * depth + leaf + closer * depth
            for where in (b'"hostile"', b'{"message": "hostile"}'):
                value = raw.replace(
                    where,
                    nested
                    if where == b'"hostile"'
                    else b'{"message": "x", "extra": ' + nested + b"}",
                )
                key, value, headers = _binary(iid, value)
                cases.append(Hostile("deep_nesting", key, value, headers, {iid}))
                iid = str(uuid.uuid4())
                raw = json.dumps(_request(iid, tokens.valid("t1"))).encode()
    return cases


# --- the test ----------------------------------------------------------------------------


async def test_hostile_input_gets_typed_outcomes_and_no_consumer_dies(running: Running) -> None:
    cases = draw_cases(make_tokens(running))
    kinds = {c.kind for c in cases}
    assert len(kinds) >= 10, kinds  # the draw covers (nearly) every kind

    async def valid(n: int) -> InvocationHandle:
        return await running.client.invoke(
            "core__echo",
            {"message": f"valid {n}"},
            tenant_id="t1",
            agent_did=AGENT,
            capability_token=running.token(),
        )

    handles = [await valid(0)]
    raw = AIOKafkaProducer(**connection_kwargs(running.settings), max_request_size=8 * LIMIT)
    await raw.start()
    placed: list[tuple[Hostile, int, int]] = []
    try:
        for n, case in enumerate(cases):
            meta = await raw.send_and_wait(
                running.topic(TopicName.REQUESTED), case.value, key=case.key, headers=case.headers
            )
            placed.append((case, meta.partition, meta.offset))
            if n % 10 == 5:
                handles.append(await valid(n))
    finally:
        await raw.stop()
    handles.append(await valid(len(cases)))

    outcomes = await asyncio.gather(*(running.client.wait(h, timeout=90) for h in handles))
    for outcome in outcomes:
        assert outcome.status is InvocationStatus.SUCCESS, outcome.error

    requested = running.topic(TopicName.REQUESTED)

    async def all_accounted_for() -> list[str]:
        results = await _read(running, TopicName.RESULTS)
        dlq = await _read(running, TopicName.DLQ)
        by_id: dict[str, ToolOutcome] = {}
        for env in results:
            outcome = ToolOutcome.model_validate(env.data)
            by_id[str(outcome.invocation_id)] = outcome
        dead = {
            (env.data["partition"], env.data["offset"])
            for env in dlq
            if env.data.get("topic") == requested
        }
        # A handler that crashed on input (retries exhausted) dead-letters internal_error:
        # hostile input must be refused as invalid, never crash a stage.
        crashed = [env.data["error"] for env in dlq if env.data["error"]["code"] != "invalid_event"]
        assert not crashed, crashed
        missing = []
        for case, partition, offset in placed:
            outcome = next((by_id[i] for i in case.invocation_ids if i in by_id), None)
            if outcome is not None:
                assert outcome.status.is_terminal
                if case.kind in {"bad_token", "forged_tenant"}:
                    assert outcome.status is not InvocationStatus.SUCCESS, case.kind
                if outcome.status is not InvocationStatus.SUCCESS:
                    assert outcome.error is not None
                    assert outcome.error.code in set(ErrorCode)
            elif (partition, offset) not in dead:
                missing.append(f"{case.kind}@{partition}:{offset}")
        assert not missing, missing
        return ["ok"]

    await eventually(all_accounted_for, timeout=90, interval=0.5)

    # Audit and status read the same hostile input: give them the time to chew on it.
    async def observers_caught_up() -> bool:
        audit = await _read(running, TopicName.AUDIT)
        last = str(outcomes[-1].invocation_id)
        return any(env.invocationid == last for env in audit)

    await eventually(observers_caught_up, timeout=60, interval=0.5)
    dead = [t for t in running.tasks if t.done()]
    assert not dead, [t.exception() for t in dead if not t.cancelled()]


async def _read(running: Running, name: TopicName) -> list[Any]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        running.topic(name),
        **connection_kwargs(running.settings),
        auto_offset_reset="earliest",
        fetch_max_wait_ms=5,
    )
    await consumer.start()
    found = []
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=300)
            if not batch:
                break
            for records in batch.values():
                found.extend(
                    decode(key=r.key, value=r.value, headers=list(r.headers)) for r in records
                )
    finally:
        await consumer.stop()
    return found
