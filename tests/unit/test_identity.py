"""Call identity read from events: W3C trace context, the trace a request starts, ids."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolfleet.events.envelope import Envelope, new_event
from toolfleet.events.identity import (
    CallRef,
    canonical_uuid,
    derived_traceparent,
    invocation_id_of,
    invocation_uuid,
    parse_traceparent,
    tenant_of,
    trace_id_of,
    traceparent_in,
    valid_traceparent,
    with_trace,
)
from toolfleet.events.models import TENANT_ID_PATTERN, AgentContext, Effect, InvokeAuthorized
from toolfleet.events.types import EventType, Source

pytestmark = pytest.mark.unit

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
REQUEST = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _request(**attrs: str | None) -> Envelope:
    return Envelope.model_validate(
        {
            "id": "evt-1",
            "source": "/agents/a1",
            "type": EventType.INVOKE_REQUESTED,
            "tenantid": "t1",
            "data": {"tool_id": "core__echo"},
            **attrs,
        }
    )


def test_a_valid_traceparent_is_parsed() -> None:
    parsed = parse_traceparent(REQUEST)
    assert parsed is not None
    assert (parsed.trace_id, parsed.parent_id, parsed.flags) == (TRACE_ID, "00f067aa0ba902b7", "01")
    assert str(parsed) == REQUEST
    assert trace_id_of(REQUEST) == TRACE_ID


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        f"00-{TRACE_ID}-00f067aa0ba902b7",  # no flags
        f"00-{TRACE_ID.upper()}-00f067aa0ba902b7-01",  # upper-case hex
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # all-zero trace id
        f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero parent id
        f"ff-{TRACE_ID}-00f067aa0ba902b7-01",  # forbidden version
        f"{REQUEST}-extra",  # version 00 takes nothing more
    ],
)
def test_an_invalid_traceparent_is_none(value: str | None) -> None:
    assert parse_traceparent(value) is None
    assert trace_id_of(value) is None
    assert valid_traceparent(value) is None


def test_a_later_version_is_read_as_version_00() -> None:
    assert valid_traceparent(f"01-{TRACE_ID}-00f067aa0ba902b7-01-more") == REQUEST


def test_a_request_without_traceparent_starts_a_trace_of_its_own() -> None:
    traced = with_trace(_request())
    assert traced.traceparent == derived_traceparent("/agents/a1", "evt-1")
    assert trace_id_of(traced.traceparent) is not None
    # Every reader of it, a redelivery included, names the same trace.
    assert with_trace(_request()).traceparent == traced.traceparent
    # Another event, another trace.
    assert trace_id_of(with_trace(_request(id="evt-2")).traceparent) != trace_id_of(
        traced.traceparent
    )


def test_an_invalid_traceparent_is_replaced_with_its_tracestate() -> None:
    traced = with_trace(_request(traceparent="00-nope", tracestate="vendor=1"))
    assert traced.traceparent == derived_traceparent("/agents/a1", "evt-1")
    assert traced.tracestate is None


def test_a_request_with_a_trace_keeps_it() -> None:
    event = _request(traceparent=REQUEST, tracestate="vendor=1")
    assert with_trace(event) is event


def test_events_derived_from_a_traced_request_carry_its_trace() -> None:
    traced = with_trace(_request())
    child = new_event(
        event_type=EventType.INVOKE_AUTHORIZED,
        source=Source.POLICY,
        data={},
        tenant_id="t1",
        invocation_id="i1",
        parent=traced,
    )
    assert child.traceparent == traced.traceparent


@given(source=st.text(min_size=1, max_size=80), event_id=st.text(min_size=1, max_size=80))
def test_every_derived_traceparent_is_valid_w3c(source: str, event_id: str) -> None:
    derived = derived_traceparent(source, event_id)
    assert valid_traceparent(derived) == derived


def _uuid_or_error(text: str) -> str | type[ValueError]:
    try:
        return str(uuid.UUID(text))
    except ValueError:
        return ValueError


def _canonical_or_error(text: str) -> str | type[ValueError]:
    try:
        return canonical_uuid(text)
    except ValueError:
        return ValueError


_SPELLINGS = (
    str,
    lambda u: str(u).upper(),
    lambda u: str(u)[:8].upper() + str(u)[8:],
    lambda u: str(u)[:-1] + str(u)[-1].upper(),
    lambda u: u.hex,
    lambda u: "{" + str(u) + "}",
    lambda u: u.urn,
    lambda u: " " + str(u),
    lambda u: str(u) + "\n",
)


@given(
    value=st.uuids(),
    spelling=st.sampled_from(_SPELLINGS),
    noise=st.text(max_size=3),
    at=st.integers(min_value=0, max_value=40),
)
def test_canonical_uuid_is_what_uuid_makes_of_any_text(
    value: uuid.UUID, spelling: object, noise: str, at: int
) -> None:
    text = spelling(value)  # type: ignore[operator]
    mutated = text[:at] + noise + text[at + len(noise) :]
    for candidate in (text, mutated, mutated.upper(), text.replace("-", "")):
        assert _canonical_or_error(candidate) == _uuid_or_error(candidate)


@given(text=st.text(max_size=45))
def test_canonical_uuid_refuses_what_uuid_refuses(text: str) -> None:
    assert _canonical_or_error(text) == _uuid_or_error(text)


def test_a_canonical_id_is_returned_as_it_came() -> None:
    text = str(uuid.uuid4())
    assert canonical_uuid(text) is text
    assert invocation_uuid(text, tenant_id="t1") is text


def test_invocation_ids_are_uuids_and_non_uuids_map_stably_within_a_tenant() -> None:
    uid = "6a1f3c1e-0000-4000-8000-000000000001"
    assert invocation_uuid(uid.upper(), tenant_id="t1") == uid
    assert invocation_uuid(uid, tenant_id="t2") == uid  # a UUID is the producer's choice
    derived = invocation_uuid("not-a-uuid", tenant_id="t1")
    assert str(uuid.UUID(derived)) == derived
    assert invocation_uuid("not-a-uuid", tenant_id="t1") == derived  # honest re-sends agree
    assert invocation_uuid("not-a-uuid-2", tenant_id="t1") != derived


def test_a_non_uuid_id_derives_a_different_id_for_each_tenant() -> None:
    # Tenant A cannot send under the id tenant B's "job-1" derives to, ahead of B.
    a = invocation_uuid("job-1", tenant_id="tenant-a")
    b = invocation_uuid("job-1", tenant_id="tenant-b")
    assert a != b
    # Nor by moving text between the tenant and the id.
    assert invocation_uuid("b:job-1", tenant_id="a") != invocation_uuid("job-1", tenant_id="a:b")


@given(
    tenants=st.tuples(st.from_regex(TENANT_ID_PATTERN, fullmatch=True), st.text(max_size=20)),
    text=st.text(min_size=1, max_size=40),
)
def test_two_tenants_never_derive_the_same_id_from_one_text(
    tenants: tuple[str, str], text: str
) -> None:
    first, other = tenants
    if first == other:
        return
    try:
        uuid.UUID(text)
    except ValueError:
        assert invocation_uuid(text, tenant_id=first) != invocation_uuid(text, tenant_id=other)


def test_an_invocation_id_with_a_lone_surrogate_maps_stably_instead_of_failing() -> None:
    odd = invocation_uuid("\ud800x", tenant_id="t1")  # valid JSON ("\\ud800x"), not UTF-8
    assert str(uuid.UUID(odd)) == odd
    assert invocation_uuid("\ud800x", tenant_id="t1") == odd
    assert odd != invocation_uuid("\udc00x", tenant_id="t1")


def test_a_request_without_invocation_id_is_named_by_its_event_id_in_its_tenant() -> None:
    assert invocation_id_of(_request()) == invocation_uuid("evt-1", tenant_id="t1")
    assert invocation_id_of(_request(tenantid="t2")) == invocation_uuid("evt-1", tenant_id="t2")
    named = _request(invocationid="x" * 300)
    assert invocation_id_of(named) == invocation_uuid("x" * 256, tenant_id="t1")


def test_the_tenant_is_read_from_the_attribute_then_the_data() -> None:
    assert tenant_of(_request()) == "t1"
    bare = _request(tenantid=None).model_copy(
        update={"data": {"agent_context": {"tenant_id": "t2"}}}
    )
    assert tenant_of(bare) == "t2"


def test_a_later_event_joins_a_trace_known_by_its_id_alone() -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    first, second = traceparent_in(trace_id), traceparent_in(trace_id)
    assert trace_id_of(first) == trace_id_of(second) == trace_id
    assert first != second  # each is a new span of the trace
    assert traceparent_in(None) is None
    assert traceparent_in("0" * 32) is None
    assert traceparent_in("not-a-trace") is None


def test_a_call_ref_names_an_authorized_call_and_its_trace() -> None:
    call = InvokeAuthorized(
        invocation_id=uuid.UUID(int=7),
        tool_id="core__echo",
        tool_version="1.0.0",
        requested_version="^1",
        agent_context=AgentContext(agent_did="did:agent:a", tenant_id="t1"),
        parameters={},
        effect=Effect.READ_ONLY,
        timeout_seconds=5,
        requested_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    ref = CallRef.of(call, trace="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    assert (ref.invocation_id, ref.tenant_id, ref.agent_did) == (
        str(uuid.UUID(int=7)),
        "t1",
        "did:agent:a",
    )
    assert (ref.tool_id, ref.tool_version) == ("core__echo", "1.0.0")
    assert ref.resolved("1.0.1").tool_version == "1.0.1"
    assert ref.tool_version == "1.0.0"  # frozen: resolved() is a copy


_HEXISH = st.sampled_from("0123456789abcdefABCDEF-x")
_HEX = "0123456789abcdef"


def _ids(size: int) -> st.SearchStrategy[str]:
    """Valid ids mostly, and the near misses: all zeros, upper case, a length off by one."""
    return st.one_of(
        st.text(_HEX, min_size=size, max_size=size),
        st.just("0" * size),
        st.text(_HEXISH, min_size=size - 1, max_size=size + 1),
    )


@given(
    version=st.sampled_from(["00", "01", "ff", "0A", "zz"]),
    trace_id=_ids(32),
    parent_id=_ids(16),
    flags=st.one_of(st.text(_HEX, min_size=2, max_size=2), st.text(_HEXISH, max_size=3)),
    rest=st.sampled_from(["", "-x", "-"]),
)
def test_the_trace_id_fast_path_answers_as_the_parser(
    version: str, trace_id: str, parent_id: str, flags: str, rest: str
) -> None:
    value = f"{version}-{trace_id}-{parent_id}-{flags}{rest}"
    parsed = parse_traceparent(value)
    assert trace_id_of(value) == (parsed.trace_id if parsed is not None else None)
    envelope = Envelope(id="e1", source="/s", type="t", traceparent=value)
    assert (with_trace(envelope).traceparent == value) is (parsed is not None)
